"""Neuron readers on fixture files written from the public formats (Neuron Monitor and Sysfs user
guides), the live-backend switch and the checkpointing warning."""

from __future__ import annotations

import json
import shutil
import sys
import warnings
from pathlib import Path

import pytest

from memviz.hardware import neuron
from memviz.hardware.neuron import (
    NEURON_CHECKPOINT_WARNING,
    NeuronCheckpointWarning,
    NeuronFormatError,
    NeuronUnavailable,
    compiled_with_o1,
    is_neuron_target,
    live_memory,
    load_monitor_report,
    neuron_available,
    parse_monitor_report,
    peak_device_bytes,
    read_monitor_stream,
    read_sysfs,
    warn_neuron_checkpointing,
)

FIXTURES = Path(__file__).parent / "fixtures" / "neuron"
CORE_BYTES = 193986816 + 176285056 + 20971520  # constants + model_code + tensors of one core


# --- neuron-monitor -----------------------------------------------------------------------------------
def test_monitor_report_memory_used():
    rep = load_monitor_report(FIXTURES / "monitor_trn1.json")
    (rt,) = rep.runtimes
    assert (rt.pid, rt.tag, rt.error) == (1234, "train_gpt", "")
    assert rt.host_bytes == 6997643264 and rt.device_bytes == 782486784
    assert rt.host_breakdown == {"application_memory": 6996594688, "constants": 0, "dma_buffers": 1048576,
                                 "tensors": 0}
    assert [c.core for c in rt.cores] == [0, 1]
    assert rt.cores[0].breakdown["tensors"] == 20971520 and rt.cores[0].used_bytes == CORE_BYTES
    assert rep.core_bytes() == {0: CORE_BYTES, 1: CORE_BYTES}
    assert rep.device_bytes == 2 * CORE_BYTES == sum(rep.core_bytes().values())
    (model,) = rt.models
    assert (model.name, model.model_id, model.is_running, model.cores) == ("neff", 10005, False, (0,))
    assert (model.host_bytes, model.device_bytes) == (20480, 21001024)
    assert model.device_breakdown == {
        "constants": 20971520, "model_code": 29504, "runtime_memory": 0, "tensors": 0
    }
    # The second application could not be read: reported, not silently dropped.
    assert rep.errors == ("5678: failed to connect to the Neuron application",)


def test_monitor_hardware_info():
    hw = load_monitor_report(FIXTURES / "monitor_trn1.json").hardware
    assert hw is not None
    assert (hw.device_type, hw.device_count, hw.cores_per_device) == ("trainium", 16, 2)
    assert hw.device_memory_bytes == 32 * 2**30 and hw.core_memory_bytes == 16 * 2**30
    assert (hw.core_version, hw.logical_core_config) == ("v2", 1)


def test_monitor_stream_peak():
    reports = read_monitor_stream(FIXTURES / "monitor_stream.jsonl")
    assert [r.device_bytes for r in reports] == [
        2 * (193986816 + 176285056 + t) for t in (20971520, 536870912, 134217728)
    ]
    assert peak_device_bytes(reports) == 2 * (193986816 + 176285056 + 536870912)
    lines = (FIXTURES / "monitor_stream.jsonl").read_text().splitlines()
    assert [r.device_bytes for r in read_monitor_stream(lines)] == [r.device_bytes for r in reports]


def test_monitor_hardware_error_and_disabled_group():
    obj = {"neuron_runtime_data": [{"pid": 7, "neuron_runtime_tag": "x", "error": "",
                                    "report": {"execution_stats": {}}}],
           "neuron_hardware_info": {"error": "neuron driver not loaded"}}
    rep = parse_monitor_report(obj)
    assert rep.runtimes == () and rep.hardware is None
    assert rep.errors == ("x: no memory_used metric group in this report",)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda o: o.pop("neuron_runtime_data"), "not a neuron-monitor report"),
        (lambda o: o.update(neuron_runtime_data={}), "must be a list"),
        (lambda o: _used(o).update(host="6997643264"), r"used_bytes\.host must be a non-negative"),
        (lambda o: _used(o).pop("neuron_device"), r"neuron_device must be a non-negative integer, got None"),
        (lambda o: _used(o)["usage_breakdown"]["neuroncore_memory_usage"].update(x={}), "is not a number"),
        (lambda o: _used(o)["usage_breakdown"]["neuroncore_memory_usage"]["0"].update(tensors=-1),
         r"\[0\]\.tensors must be a non-negative"),
        (lambda o: o["neuron_hardware_info"].update(neuron_device_count=True), "neuron_device_count"),
        (lambda o: _memory(o).update(loaded_models={}), "loaded_models must be a list"),
        (lambda o: _memory(o)["loaded_models"][0]["subgraphs"]["sg_00"]["memory_used_bytes"].update(
            neuron_device=1.5), r"sg_00\.memory_used_bytes\.neuron_device"),
    ],
)
def test_monitor_bad_input(mutate, message):
    obj = json.loads((FIXTURES / "monitor_trn1.json").read_text())
    mutate(obj)
    with pytest.raises(NeuronFormatError, match=message):
        parse_monitor_report(obj)


def _memory(obj):
    return obj["neuron_runtime_data"][0]["report"]["memory_used"]


def _used(obj):
    return _memory(obj)["neuron_runtime_used_bytes"]


def test_monitor_truncated_and_missing(tmp_path):
    good = (FIXTURES / "monitor_stream.jsonl").read_text().splitlines()
    cut = tmp_path / "cut.jsonl"
    cut.write_text(good[0] + "\n" + good[1][:200] + "\n")
    with pytest.raises(NeuronFormatError, match="line 2 is not JSON.*cut off"):
        read_monitor_stream(cut)
    with pytest.raises(NeuronFormatError, match="read_monitor_stream"):
        load_monitor_report(FIXTURES / "monitor_stream.jsonl")  # a stream is not one document
    with pytest.raises(NeuronFormatError, match="holds no report"):
        read_monitor_stream(["", "  "])
    with pytest.raises(FileNotFoundError, match="neuron-monitor > file"):
        read_monitor_stream(tmp_path / "absent.jsonl")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(NeuronFormatError, match="nests too deeply"):
        load_monitor_report(deep)
    with pytest.raises(NeuronFormatError, match="not a neuron-monitor report"):
        read_monitor_stream(["[1, 2]"])


# --- sysfs --------------------------------------------------------------------------------------------
def test_sysfs_counters():
    snap = read_sysfs(FIXTURES / "sysfs")
    assert [(c.device, c.core) for c in snap.cores] == [(0, 0), (0, 1), (1, 0)]
    c00, c01, c10 = snap.cores
    # Aggregate counters: total = current usage, peak = the joint peak (below the sum of category peaks).
    assert c00.used_bytes == 1401946112 == sum(c00.breakdown.values())
    assert c00.peak_bytes == 1653604352 < sum(c00.peak_breakdown.values())
    assert c00.breakdown["tensors"] == 1073741824 and c00.peak_breakdown["tensors"] == 1342177280
    zero_categories = {"collectives", "model_shared_scratchpad", "nonshared_scratchpad", "uncategorized"}
    assert zero_categories <= set(c00.breakdown)
    assert c01.used_bytes == 536870912 + 268435456 + 52428800 + 4194304
    # Only per-category counters: the current usage is their sum, the joint peak is unknown.
    assert c10.used_bytes == 33554432 + 1048576 and c10.peak_bytes is None
    assert snap.peak_bytes == 1653604352
    assert snap.device_bytes == c00.used_bytes + c01.used_bytes + c10.used_bytes
    assert snap.core_counts == {0: 2, 1: 1} and snap.arch == {0: "NDv2", 1: "NDv2"}
    assert snap.host[0]["application_memory"] == 6996594688 and 1 not in snap.host


def test_sysfs_bad_trees(tmp_path):
    with pytest.raises(FileNotFoundError, match="no Neuron driver"):
        read_sysfs(tmp_path / "absent")
    with pytest.raises(NeuronFormatError, match="no neuron<N> device"):
        read_sysfs(tmp_path)
    tree = tmp_path / "tree"
    shutil.copytree(FIXTURES / "sysfs", tree)
    counter = tree / "neuron0/neuron_core1/stats/memory_usage/device_mem/tensors/total"
    counter.write_text("lots\n")
    with pytest.raises(NeuronFormatError, match=r"tensors/total: expected an integer counter, found 'lots'"):
        read_sysfs(tree)
    shutil.rmtree(tree / "neuron0/neuron_core1/stats")
    with pytest.raises(NeuronFormatError, match="no stats/memory_usage/device_mem"):
        read_sysfs(tree)


# --- live backend ---------------------------------------------------------------------------------------
@pytest.fixture
def fake_sdk(tmp_path, monkeypatch):
    """Put a module named torch_neuronx on sys.path; `body` is its source."""
    def make(body: str) -> None:
        (tmp_path / "torch_neuronx.py").write_text(body)
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, "torch_neuronx", raising=False)
        neuron_available.cache_clear()
    yield make
    sys.modules.pop("torch_neuronx", None)
    neuron_available.cache_clear()


def test_live_backend_off_without_sdk(monkeypatch):
    monkeypatch.setattr(neuron.importlib.util, "find_spec", lambda name: None)
    neuron_available.cache_clear()
    try:
        assert not neuron_available()
        with pytest.raises(NeuronUnavailable, match="torch-neuronx.*fake:trn1"):
            live_memory(FIXTURES / "sysfs")
    finally:
        neuron_available.cache_clear()


def test_live_backend_on_when_importable(fake_sdk):
    fake_sdk("VERSION = 'test'\n")
    assert neuron_available()
    assert live_memory(FIXTURES / "sysfs").peak_bytes == 1653604352


def test_live_backend_off_when_import_fails(fake_sdk):
    fake_sdk("raise ImportError('libnrt.so.1: cannot open shared object file')\n")
    assert not neuron_available()


# --- checkpointing warning --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "device", ["neuron", "neuron:3", "fake:trn1", "fake:trn2", "trn1n", "inf2", "fake:INF2", "trainium2"]
)
def test_warns_for_neuron_targets(device):
    with pytest.warns(NeuronCheckpointWarning, match=r'NEURON_CC_FLAGS="-O1"'):
        assert warn_neuron_checkpointing(device, env={})
    assert is_neuron_target(device)


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:0", "fake:h100", "fake:a100", "meta", "infinity"])
def test_silent_for_other_devices(device):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not warn_neuron_checkpointing(device, env={})


def test_xla_is_neuron_only_with_the_sdk(monkeypatch):
    monkeypatch.setattr(neuron, "neuron_available", lambda: False)
    assert not is_neuron_target("xla:0")
    monkeypatch.setattr(neuron, "neuron_available", lambda: True)
    assert is_neuron_target("xla:0")


@pytest.mark.parametrize(
    ("flags", "o1"),
    [("-O1", True), ("--model-type transformer -O1", True), ("--optlevel 1", True), ("--optlevel=1", True),
     ("-O 1", True), ("", False), ("-O2", False), ("-O1 -O3", False), ("-O3 -O1", True),
     ("--auto-cast=none", False)],
)
def test_o1_detection(flags, o1):
    assert compiled_with_o1(flags) is o1


def test_o1_silences_the_warning(monkeypatch):
    monkeypatch.setenv("NEURON_CC_FLAGS", "--model-type transformer -O1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not warn_neuron_checkpointing("fake:trn1")
    monkeypatch.setenv("NEURON_CC_FLAGS", "-O2")
    with pytest.warns(NeuronCheckpointWarning) as record:
        warn_neuron_checkpointing("neuron")
    assert str(record[0].message) == NEURON_CHECKPOINT_WARNING
    assert record[0].filename == __file__  # points at the caller, so the user sees where it came from


@pytest.mark.slow
def test_plan_with_recomputation_warns_on_neuron_targets(monkeypatch):
    """memviz.plan warns when its schedule recomputes and the profile's device is a Neuron target."""
    import torch

    import memviz

    monkeypatch.delenv("NEURON_CC_FLAGS", raising=False)
    blocks = [torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh()) for _ in range(6)]
    model = torch.nn.Sequential(*blocks)
    x = torch.randn(64, 32)
    kw = {"strategy": "checkmate", "time_limit": 5.0, "frontier": False, "packing": False}
    with pytest.warns(NeuronCheckpointWarning) as record:
        plan = memviz.plan(memviz.profile(model, (x,), device="fake:trn1"), 0.9, **kw)
    assert plan.timeline.recomputes > 0
    assert record[0].filename == __file__  # points at the user's memviz.plan call
    with warnings.catch_warnings():
        warnings.simplefilter("error", NeuronCheckpointWarning)
        memviz.plan(memviz.profile(model, (x,), device="fake:h100"), 0.9, **kw)
