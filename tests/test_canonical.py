"""The canonical search (solvers.olla.canonical, MiniMalloc Sec. 4-5): exact on small instances, honest
refusals, the deadline kept, and the greedy incumbent's passes keeping the time limit."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_pack import brute_force_peak, random_buffers

from solvers.deadline import Deadline
from solvers.olla import PackingError, canonical, max_live, pack, validate_packing
from solvers.olla.canonical import canonical_fit
from solvers.olla.minimalloc import read_csv
from solvers.olla.pack import _greedy_segments, _sweep_fit, greedy_pack

MINIMALLOC = Path(__file__).resolve().parent / "fixtures" / "minimalloc"  # MiniMalloc instances (SOURCE.md)

#: max-live 4, but no placement fits in 4 (MiniMalloc's solver test "InfeasibleTricky")
NO_FIT_AT_MAX_LIVE = [(0, 1, 3), (0, 3, 1), (4, 5, 3), (2, 5, 1), (1, 2, 2), (3, 4, 2), (1, 4, 1)]


def later() -> Deadline:
    return Deadline.after(60.0)


@pytest.mark.parametrize("seed", range(12))
def test_fits_exactly_at_the_optimum_and_proves_one_less_impossible(seed: int) -> None:
    buffers = random_buffers(seed, 6)
    best = brute_force_peak(buffers)
    fit = canonical_fit(buffers, best, later())
    assert fit.outcome == "fits" and fit.offsets is not None
    assert validate_packing(buffers, fit.offsets, best) == []
    assert canonical_fit(buffers, best - 1, later()).outcome == "infeasible"


def test_minimalloc_example_fits_12_and_not_11() -> None:
    _, buffers = read_csv(MINIMALLOC / "input.12.csv")
    fit = canonical_fit(buffers, 12, later())
    assert fit.outcome == "fits" and validate_packing(buffers, fit.offsets, 12) == []
    assert canonical_fit(buffers, 11, later()).outcome == "infeasible"


def test_infeasible_above_max_live_is_refused_with_the_proof() -> None:
    """Max-live alone does not refuse this instance; the exhausted search does, and `pack` says so."""
    assert max_live(NO_FIT_AT_MAX_LIVE) == 4 and brute_force_peak(NO_FIT_AT_MAX_LIVE) == 5
    assert canonical_fit(NO_FIT_AT_MAX_LIVE, 4, later()).outcome == "infeasible"
    with pytest.raises(PackingError, match="proved impossible by exhaustive canonical search"):
        pack(NO_FIT_AT_MAX_LIVE, 4, time_limit=5.0)
    assert pack(NO_FIT_AT_MAX_LIVE, 5, time_limit=5.0).peak_bytes == 5


def test_zero_sizes_and_oversized_buffers() -> None:
    assert canonical_fit([(0, 2, 0), (1, 3, 4)], 4, later()).offsets == (0, 0)
    assert canonical_fit([(0, 2, 5)], 4, later()).outcome == "infeasible"


def test_a_passed_deadline_stops_the_search_at_once() -> None:
    _, buffers = read_csv(MINIMALLOC / "E.1048576.csv")
    found = canonical_fit(buffers, 1048576, Deadline(time.monotonic() - 1.0))
    assert found.outcome == "out-of-time" and found.offsets is None and found.nodes <= 1


def test_the_deadline_is_checked_at_every_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deadline that passes after 50 checks ends the search at the 51st node, out of time
    (E needs thousands of nodes under every preorder)."""
    checks = iter(range(10**6))
    monkeypatch.setattr(Deadline, "passed", lambda self: next(checks) >= 50)
    _, buffers = read_csv(MINIMALLOC / "E.1048576.csv")
    found = canonical_fit(buffers, 1048576, later())
    assert found.outcome == "out-of-time" and found.nodes == 51


def test_preorders_take_turns_without_visiting_a_node_twice() -> None:
    """Issue 21: each preorder's search resumes where its last turn stopped instead of restarting with a
    doubled node limit, so a preorder given twice costs at most twice its nodes alone (the restarts
    cost 14,160 nodes on A, where TWA alone needs 4,920), and the fit is the one it finds alone."""
    _, buffers = read_csv(MINIMALLOC / "A.1048576.csv")
    alone = canonical_fit(buffers, 1048576, later(), preorders=("TWA",))
    twice = canonical_fit(buffers, 1048576, later(), preorders=("TWA", "TWA"))
    assert alone.outcome == twice.outcome == "fits"
    assert twice.nodes <= 2 * alone.nodes and twice.offsets == alone.offsets


@pytest.mark.parametrize("capacity, outcome", [(12, "fits"), (11, "infeasible")])
def test_portfolio_of_processes(monkeypatch: pytest.MonkeyPatch, capacity: int, outcome: str) -> None:
    """With no in-process head start, forked processes race over the preorders; a fit comes back
    checked, and one process's exhausted search is the proof."""
    monkeypatch.setattr(canonical, "SOLO_NODES", 0)
    _, buffers = read_csv(MINIMALLOC / "input.12.csv")
    found = canonical_fit(buffers, capacity, later(), processes=3)
    assert found.outcome == outcome
    if outcome == "fits":
        assert validate_packing(buffers, found.offsets, capacity) == []


def test_portfolio_answers_as_its_fewest_nodes_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """The processes race, but the answer does not depend on which finishes first: it is the fit of
    the preorder that needs the fewest nodes (TWA on A: 4,920; the others need 14,000 and 95,000),
    found again on every run."""
    monkeypatch.setattr(canonical, "SOLO_NODES", 0)
    _, buffers = read_csv(MINIMALLOC / "A.1048576.csv")
    alone = canonical_fit(buffers, 1048576, later(), preorders=("TWA",))
    raced = canonical_fit(buffers, 1048576, later(), preorders=("WAT", "TWA", "TAW"), processes=3)
    assert raced.outcome == "fits" and (raced.nodes, raced.offsets) == (alone.nodes, alone.offsets)


def test_the_sections_are_built_once_for_several_capacities(monkeypatch: pytest.MonkeyPatch) -> None:
    """`pack` asks about one segment at several capacities; building its overlap lists is quadratic and
    outside the search's deadline (0.3-0.7 s a call at 4k buffers took `pack_schedule` past its limit).
    They are not kept past `pack` (tens of MB at 10k buffers)."""
    built: list[int] = []
    real = canonical._Instance
    monkeypatch.setattr(canonical, "_Instance", lambda b: built.append(len(b)) or real(b))
    canonical._instance.cache_clear()
    _, buffers = read_csv(MINIMALLOC / "input.12.csv")
    assert canonical_fit(buffers, 12, later()).outcome == "fits"
    assert canonical_fit(buffers, 11, later()).outcome == "infeasible"
    assert built == [len(buffers)]
    pack(buffers, time_limit=5.0)
    assert canonical._instance.cache_info().currsize == 0  # pack lets them go when it returns


def test_first_greedy_pass_keeps_the_time_limit() -> None:
    """Issue 21: the first greedy pass ignored the deadline.  With no time left the O(n^2) best-fit passes
    are dropped and the complete best fit in start order (`_sweep_fit`, O(n log n)) stays (issue pack27:
    stacking what a cut pass had not placed put a 92-layer GPT's packing at 6x its max-live bound)."""
    buffers = random_buffers(3, 300)
    ids = list(range(len(buffers)))
    ((placed, peak),), orders = _greedy_segments(buffers, ids, [ids], time.perf_counter() - 1.0)
    assert orders == ["start"]
    assert validate_packing(buffers, placed) == []
    assert (placed, peak) == _sweep_fit(buffers, ids)
    assert peak != greedy_pack(buffers, "taw")[1]


@pytest.mark.parametrize("name, preorder, nodes", [("A", "TWA", 4920), ("K", "TWA", 1921),
                                                   ("K", "WAT", 1938)])
def test_node_counts_of_the_challenging_set_are_pinned(name: str, preorder: str, nodes: int) -> None:
    """The search is counted work: each preorder's search visits the same nodes on any machine, and the
    per-node rewrites (fewer numpy calls, the inference checked before any floor is written) kept
    every node and offset of A-K.  A change of these counts is a change of the search, not of speed."""
    _, buffers = read_csv(MINIMALLOC / f"{name}.1048576.csv")
    fit = canonical_fit(buffers, 1048576, later(), preorders=(preorder,))
    assert (fit.outcome, fit.nodes) == ("fits", nodes)
    assert validate_packing(buffers, fit.offsets, 1048576) == []
