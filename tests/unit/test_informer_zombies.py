"""Deleted objects stay deleted in the informer cache.

The answer to one of the operator's own writes can reach the cache after the
watch has already reported the object deleted; put in then, it would bring the
object back as a zombie that the reconcilers act on (a Sandbox that no longer
exists getting a new Pod). Deleted keys are remembered with the resourceVersion
they were gone at."""

from __future__ import annotations

from typing import Any

from jupyter_sandbox.agent_sandbox import SANDBOX
from jupyter_sandbox.kube.informer import Informer


def sandbox(rv: int, uid: str = "u1") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "sb", "uid": uid, "resourceVersion": str(rv)}}


def informer() -> Informer:
    return Informer(client=None, res=SANDBOX)  # type: ignore[arg-type]  # no API calls here


def test_a_late_write_answer_does_not_resurrect_a_deleted_object() -> None:
    inf = informer()
    inf._apply("ADDED", sandbox(5))
    inf._apply("DELETED", sandbox(7))
    inf.upsert_local(sandbox(6))  # our status patch, answered before the delete
    assert inf.get("ns", "sb") is None


def test_an_object_created_again_under_the_same_name_is_cached() -> None:
    inf = informer()
    inf._apply("ADDED", sandbox(5))
    inf._apply("DELETED", sandbox(7))
    inf.upsert_local(sandbox(9, uid="u2"))  # we created it again
    cached = inf.get("ns", "sb")
    assert cached is not None and cached["metadata"]["uid"] == "u2"


def test_a_relist_buries_what_it_no_longer_lists_at_the_lists_version() -> None:
    inf = informer()
    inf._apply("ADDED", sandbox(5))
    # Missed while the watch was down: deleted at some version up to the list's (20).
    inf._apply("DELETED", inf.get("ns", "sb") or {}, gone_at=20)
    inf.upsert_local(sandbox(12))
    assert inf.get("ns", "sb") is None
    inf._apply("ADDED", sandbox(25, uid="u2"))  # the watch sees it again: no tombstone left
    inf.upsert_local(sandbox(26, uid="u2"))
    assert (inf.get("ns", "sb") or {})["metadata"]["resourceVersion"] == "26"
