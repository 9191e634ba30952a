# SPDX-License-Identifier: Apache-2.0
"""`lab.vms` and `nodes[].kernel` as the lab file reader takes or refuses them (no VM boots here):
each refusal is one error naming the field and the value."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from meshctl.errors import InputError
from meshctl.lab.namespaces.spec import DEFAULT_NODE_KERNEL, parse_lab

from .conftest import BASE


def with_kernels(kernels: list[object], lab: dict | None = None) -> dict:
    doc = dict(BASE, nodes=[dict(n) for n in BASE["nodes"]])
    for n, k in zip(doc["nodes"], kernels, strict=False):
        if k is not None:
            n["kernel"] = k
    doc["lab"] = {"vms": True, **(lab or {})}
    return doc


def test_each_node_gets_its_kernel_and_the_rest_the_default():
    spec = parse_lab(with_kernels(["5.10", 6.12]))  # 6.12 as YAML reads it unquoted
    names = [n.name for n in spec.clusters[0].nodes]
    assert spec.options.vms
    assert spec.options.kernel_of(names[0], "default") == "5.10"
    assert spec.options.kernel_of(names[1], "default") == "6.12"
    assert all(spec.options.kernel_of(n, "default") == DEFAULT_NODE_KERNEL for n in names[2:])


@pytest.mark.parametrize("doc,field,says", [
    (lambda: with_kernels([5.1]), "nodes[0].kernel", 'quote the series ("5.10")'),
    (lambda: with_kernels(["4.19"]), "nodes[0].kernel", "is not a kernel series of the lab (5.10, 6.1, 6.12)"),
    (lambda: {**with_kernels(["6.1"]), "lab": {}}, ".kernel", "is for VM labs (lab.vms: true)"),
    (lambda: with_kernels([], {"vms": "yes"}), "lab.vms", "is not true or false"),
    (lambda: with_kernels([], {"backend": "kubernetes"}), "lab.backend", "is not available with lab.vms"),
    (lambda: with_kernels([], {"nat": {"a1": "cone"}}), "lab.nat", "is not available with lab.vms"),
])
def test_refusals_name_the_field(doc, field, says):
    with pytest.raises(InputError) as e:
        parse_lab(doc())
    assert field in str(e.value) and says in str(e.value), str(e.value)


def test_kernel_flag_and_vms_do_not_mix(tmp_path):
    p = tmp_path / "vms.yaml"
    p.write_text(yaml.safe_dump(with_kernels(["6.1"])))
    r = subprocess.run([sys.executable, "-m", "meshctl.cli", "lab", "up", "--kernel", "6.1", "-f", str(p)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "--kernel: '6.1' is for a lab in one VM" in r.stderr
