# SPDX-License-Identifier: Apache-2.0
"""manifests/admission-policy.yaml, offline: both objects pass the Kubernetes schemas, and the
policy's CEL, evaluated here (cel-python), lets the agent change its own node's agent annotations
and nothing else: not another node, not a person's annotation, not labels or spec, not without a
token that names its node."""

from __future__ import annotations

import copy
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml

from meshctl.backends.kube.backend import SEEN_LABEL, seen_configmap
from meshctl.backends.kube.nodes import AGENT_ANNOTATIONS, LOCATION, PREFIX

from .helpers import MANIFESTS
from .test_manifests import by_kind

POLICY_FILE = MANIFESTS / "admission-policy.yaml"
# ValidatingAdmissionPolicy v1 exists from 1.30 on; the newest schemas bundled, and 1.30.
VERSIONS = [kubernetes_validate.latest_version(), "1.30"]
NODE_KEY = "authentication.kubernetes.io/node-name"


NODE_POLICY, SUMMARY_POLICY = "meshctl-agent-own-node", "meshctl-agent-own-summary"


def objects(name: str = NODE_POLICY) -> dict[str, dict[str, Any]]:
    """The policy `name` and its binding, by kind."""
    return {d["kind"]: d for d in yaml.safe_load_all(POLICY_FILE.read_text()) if d and d["metadata"]["name"] == name}


@pytest.mark.parametrize("version", VERSIONS)
def test_the_policy_passes_the_schemas(version: str) -> None:
    docs = [d for d in yaml.safe_load_all(POLICY_FILE.read_text()) if d]
    assert len(docs) == 4
    for d in docs:
        kubernetes_validate.validate(d, version, strict=True)
    broken = copy.deepcopy(objects()["ValidatingAdmissionPolicy"])
    broken["spec"]["validations"][0]["expresion"] = "true"  # a typo is caught
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)


@pytest.mark.parametrize("name", [NODE_POLICY, SUMMARY_POLICY])
def test_binding_and_subject_match_the_other_manifests(name: str) -> None:
    policy, binding = objects(name)["ValidatingAdmissionPolicy"], objects(name)["ValidatingAdmissionPolicyBinding"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"] and policy["spec"]["failurePolicy"] == "Fail"
    sa = by_kind("ServiceAccount")["metadata"]
    (cond,) = policy["spec"]["matchConditions"]
    assert f"'system:serviceaccount:{sa['namespace']}:{sa['name']}'" in cond["expression"]
    assert "admission-policy.yaml" not in (MANIFESTS / "kustomization.yaml").read_text()  # 1.30+ only: opt in


class Policy:
    """The policy's match condition, variables and validations, compiled with cel-python."""

    def __init__(self, name: str = NODE_POLICY) -> None:
        spec = objects(name)["ValidatingAdmissionPolicy"]["spec"]
        self.env = celpy.Environment()
        self.match = [self._compile(c["expression"]) for c in spec["matchConditions"]]
        self.variables = [(v["name"], self._compile(v["expression"])) for v in spec["variables"]]
        # (check, message): a messageExpression is compiled and evaluated like the API server does
        self.validations = [(self._compile(v["expression"]),
                             v["message"] if "message" in v else self._compile(v["messageExpression"]))
                            for v in spec["validations"]]

    def _compile(self, expr: str) -> Any:
        return self.env.program(self.env.compile(expr))

    def variable(self, request: dict[str, Any], obj: dict[str, Any], old: dict[str, Any], name: str) -> Any:
        ctx = self._context(request, obj, old)
        return ctx["variables"][name]

    def _context(self, request: dict[str, Any], obj: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
        act: dict[str, Any] = {"request": celpy.json_to_cel(request), "object": celpy.json_to_cel(obj),
                               "oldObject": celpy.json_to_cel(old), "variables": {}}
        for name, prog in self.variables:
            act["variables"][name] = prog.evaluate({**act, "variables": celpy.celtypes.MapType(act["variables"])})
        act["variables"] = celpy.celtypes.MapType(act["variables"])
        return act

    def review(self, request: dict[str, Any], obj: dict[str, Any], old: dict[str, Any]) -> str | None:
        """None when the change is allowed (or the policy does not apply), else the first message."""
        act = self._context(request, obj, old)
        if not all(bool(m.evaluate(act)) for m in self.match):
            return None
        for prog, message in self.validations:
            if not bool(prog.evaluate(act)):
                return message if isinstance(message, str) else str(message.evaluate(act))
        return None


AGENT = "system:serviceaccount:meshctl:meshctl"


def req(node: str | None = "a1", user: str = AGENT) -> dict[str, Any]:
    return {"userInfo": {"username": user, "extra": {NODE_KEY: [node]} if node else {}}}


def node(name: str = "a1", **ann: str) -> dict[str, Any]:
    base = {PREFIX + "public-key": "old", PREFIX + LOCATION: "hel", "kubeadm.alpha.kubernetes.io/cri-socket": "x"}
    base.update(ann)
    return {"metadata": {"name": name, "annotations": base, "labels": {"kubernetes.io/hostname": name}},
            "spec": {"podCIDR": "10.42.1.0/24"}}


def changed(obj: dict[str, Any], fn: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    fn(out)
    return out


# (case, request, old node, new node, None if allowed else words of the message)
CASES: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any], str | None]] = [
    ("its own public key", req(), node(), node(**{PREFIX + "public-key": "new"}), None),
    ("its own last-seen, new", req(), node(), node(**{PREFIX + "last-seen": "2026-12-01T08:00:00Z"}), None),
    ("another node", req("b2"), node(), node(**{PREFIX + "public-key": "new"}), "may not change node"),
    ("a person's location", req(), node(), node(**{PREFIX + LOCATION: "fsn"}), "only its own annotations"),
    ("someone else's annotation", req(), node(), changed(node(), lambda n: n["metadata"]["annotations"].pop(
        "kubeadm.alpha.kubernetes.io/cri-socket")), "only its own annotations"),
    ("a label", req(), node(), changed(node(), lambda n: n["metadata"]["labels"].update(role="x")), "labels or spec"),
    ("the pod CIDR", req(), node(), changed(node(), lambda n: n["spec"].update(podCIDR="10.42.9.0/24")),
     "labels or spec"),
    ("a token without its node", req(None), node(), node(**{PREFIX + "public-key": "new"}), "names no node"),
    ("not the agent", req("b2", user="system:node:b2"), node(), node(**{PREFIX + LOCATION: "fsn"}), None),
]


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy()


@pytest.mark.parametrize("case,request_,old,new,words", CASES, ids=[c[0] for c in CASES])
def test_the_agent_changes_only_its_own_annotations_on_its_own_node(policy: Policy, case: str, request_: dict,
                                                                    old: dict, new: dict, words: str | None) -> None:
    got = policy.review(request_, new, old)
    if words is None:
        assert got is None, (case, got)
    else:
        assert got is not None and words in got, (case, got)


def test_the_policy_lists_exactly_the_keys_the_agent_writes(policy: Policy) -> None:
    keys = policy.variable(req(), node(), node(), "agentKeys")
    assert sorted(str(k) for k in keys) == sorted(AGENT_ANNOTATIONS)


def configmap(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "meshctl", "labels": {SEEN_LABEL: "true"}},
            "data": {"seen": "{}"}}


SUMMARY_CASES: list[tuple[str, dict[str, Any], dict[str, Any], str | None]] = [
    ("its own summary", req(), configmap(seen_configmap("a1")), None),
    ("another node's summary", req("b2"), configmap(seen_configmap("a1")), "may write only configmap meshctl-seen-b2"),
    ("the mesh settings", req(), configmap("meshctl"), "may write only configmap meshctl-seen-a1, not meshctl"),
    ("a token without its node", req(None), configmap(seen_configmap("a1")), "names no node"),
    ("not the agent", req(user="kubernetes-admin"), configmap("meshctl"), None),
]


@pytest.mark.parametrize("case,request_,obj,words", SUMMARY_CASES, ids=[c[0] for c in SUMMARY_CASES])
def test_the_agent_writes_only_its_own_nodes_summary(case: str, request_: dict, obj: dict, words: str | None) -> None:
    got = Policy(SUMMARY_POLICY).review(request_, obj, {})
    if words is None:
        assert got is None, (case, got)
    else:
        assert got is not None and words in got, (case, got)
