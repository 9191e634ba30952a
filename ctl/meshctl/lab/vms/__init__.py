# SPDX-License-Identifier: Apache-2.0
"""Labs in VMs booting Debian's kernels: one guest (vm), the namespace lab inside one VM (vmlab),
a VM per lab node (vmnodes) and the kernel matrix of the test suites (matrix)."""
