"""The activation dial's measurement under a limit: which candidates it probes."""

from __future__ import annotations

from benchmarks.activation_dial.activation_dial import _dial_candidates


def test_under_a_wide_limit_only_candidates_recomputing_nothing_are_probed() -> None:
    chosen, predictions = _dial_candidates("gpt-tiny", 16, [0], [2, 4], 2**40)
    assert [c.label for c in chosen] == ["z0 fp32 mb2x4", "z0 fp32 mb4x2"]
    assert len(predictions) == 2


def test_under_a_tight_limit_each_policy_takes_its_smallest_share_that_fits() -> None:
    _, predictions = _dial_candidates("gpt-tiny", 16, [0], [4], 2**40)
    none_mib = predictions[0]["predicted_MiB"]
    limit = int((none_mib - 0.1) * 2**20)  # just under recomputing nothing
    chosen, predictions = _dial_candidates("gpt-tiny", 16, [0], [4], limit)
    predicted = {p["label"]: p["predicted_MiB"] for p in predictions}
    assert "z0 fp32 mb4x2" not in [c.label for c in chosen]
    for candidate in chosen:
        assert predicted[candidate.label] < none_mib
    policies = [c.checkpoint_policy for c in chosen if c.checkpoint_fraction < 1]
    assert len(policies) == len(set(policies))  # one share per policy: the smallest
    full = [c for c in chosen if c.checkpoint_fraction == 1 and c.checkpoint_policy == "full"]
    assert len(full) == 1  # every block in full, the all-or-nothing answer, is probed too
