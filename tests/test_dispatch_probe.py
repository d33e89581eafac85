"""experiments/dispatch_probe.py: its trace readers on hand-made Chrome-format traces, its
option parser and its interleaved timing on trivial calls."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import dispatch_probe
from experiments.dispatch_probe import (interleaved, parse_options, pipeline_rounds, sync_phases,
                                       timeline)
from tests.test_trace_moba import _meta, _x


_PROCESSES = [_meta(1, "/host:CPU"), _meta(1, "python", tid=1), _meta(2, "/device:GPU:0"),
              _meta(2, "Stream #14(Compute)", tid=14), _meta(2, "XLA Ops", tid=99)]


def test_timeline_counts_idle_gaps_between_kernels():
  """Two steps: kernels a 0-100, b 100-300 | c 310-400, d 400-600 (a 10 us gap before c,
  while the host runs cuGraphLaunch 302-309), and a derived-line event that is ignored."""
  kernels = [("a", 0, 100), ("b", 100, 200), ("c", 310, 90), ("d", 400, 200)]
  trace = {"traceEvents": _PROCESSES + [_x(2, 14, n, dur, ts) for n, ts, dur in kernels] + [
      _x(2, 99, "fusion", 600), _x(1, 1, "cuGraphLaunch", 7, ts=302),
      _x(1, 1, "PjitFunction(step)", 5000)]}  # spans the gap many times over: not listed
  tl = timeline(trace, steps=2)
  assert tl["span_ms_per_step"] == pytest.approx(0.3)
  assert tl["busy_ms_per_step"] == pytest.approx(0.295)
  assert tl["idle_ms_per_step"] == pytest.approx(0.005)
  assert tl["kernels"] == 4
  assert tl["idle_us_by_neighbours"] == {"b -> c": pytest.approx(10.0)}
  [gap] = tl["longest_gaps"]
  assert (gap["before"], gap["after"], gap["gap_us"]) == ("b", "c", pytest.approx(10.0))
  assert gap["host_events"] == [("cuGraphLaunch", 1)]


def test_timeline_of_overlapping_kernels_has_no_idle_time():
  trace = {"traceEvents": _PROCESSES + [_meta(2, "Stream #15(Compute)", tid=15),
                                        _x(2, 14, "a", 100), _x(2, 15, "b", 100, ts=50)]}
  tl = timeline(trace, steps=1)
  assert tl["span_ms_per_step"] == pytest.approx(0.15)
  assert tl["idle_ms_per_step"] == pytest.approx(0.0)
  with pytest.raises(ValueError, match="no kernels"):
    timeline({"traceEvents": _PROCESSES}, steps=1)


def test_sync_phases_split_each_call_at_its_first_and_last_kernel():
  """Two synchronised calls, each a jitted call event (with one nested inside it) whose
  kernels run after a dispatch delay, then a block_until_ready that returns after them:
  call 1 dispatches in 40 us, runs 0.5 ms, wakes in 20; call 2 in 60, 0.7 ms, 10."""
  events = []
  for start, dispatch, gpu, wake in ((0, 40, 500, 20), (10_000, 60, 700, 10)):
    events += [_x(1, 1, "PjitFunction(step)", 30, ts=start),
               _x(1, 1, "PjitFunction(step)", 20, ts=start + 5),  # nested: the same call
               _x(2, 14, "k1", gpu / 2, ts=start + dispatch),
               _x(2, 14, "k2", gpu / 2, ts=start + dispatch + gpu / 2),
               _x(1, 1, "$api.py:2757 block_until_ready", dispatch + gpu + wake - 30,
                  ts=start + 30)]
  phases = sync_phases({"traceEvents": _PROCESSES + events})
  assert phases["calls"] == 2
  # Medians of two values: the upper one.
  assert phases["dispatch"] == pytest.approx(0.060)
  assert phases["gpu_span"] == pytest.approx(0.700)
  assert phases["wake_up"] == pytest.approx(0.020)
  assert phases["call"] == pytest.approx(0.770)


def test_parse_options_reads_ints_and_strings_and_names_a_bad_entry():
  assert parse_options("xla_gpu_graph_min_graph_size=100000;"
                       "xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL") == {
      "xla_gpu_graph_min_graph_size": 100000,
      "xla_gpu_enable_command_buffer": "FUSION,CUSTOM_CALL"}
  assert parse_options("xla_gpu_enable_command_buffer=") == {"xla_gpu_enable_command_buffer": ""}
  with pytest.raises(ValueError, match="'oops' is not name=value"):
    parse_options("a=1;oops")
  assert parse_options("xla_gpu_autotune_level=-1") == {"xla_gpu_autotune_level": -1}
  with pytest.raises(ValueError, match="'=4' is not name=value"):
    parse_options("=4")


def test_interleaved_times_every_call_each_round():
  """Every call gets one synchronised median per round, summarised as median <= the range's
  ends; a call that raises stops the comparison rather than dropping out of it."""
  fns = {"add": (jax.jit(lambda x: x + 1), (jnp.ones(4),)),
         "mul": (jax.jit(lambda x: x * 2), (jnp.ones(4),))}
  out = interleaved(fns, rounds=3, reps=2)
  assert set(out) == {"add", "mul"}
  for row in out.values():
    assert len(row["rounds_ms"]) == 3
    assert 0 < row["min_ms"] <= row["median_ms"] <= row["max_ms"]
  with pytest.raises(TypeError, match="missing 1 required positional argument"):
    interleaved({"bad": (jax.jit(lambda x: x + 1), ())}, rounds=1, reps=1)


def test_pipeline_rounds_time_every_call_each_round():
  """Each round gives every call its back-to-back, traced and synchronised times; the GPU's
  span is read from the trace only where there are GPU kernels (none on the CPU)."""
  fns = {"add": (jax.jit(lambda x: x + 1), (jnp.ones(4),)),
         "mul": (jax.jit(lambda x: x * 2), (jnp.ones(4),))}
  out = pipeline_rounds(fns, rounds=2, calls=3)
  assert set(out) == {"add", "mul"}
  for rows in out.values():
    assert len(rows) == 2
    for row in rows:
      assert min(row["pipelined_ms"], row["traced_wall_ms"], row["sync_ms"]) > 0
      has_gpu = jax.default_backend() == "gpu"
      assert ("span_ms_per_step" in row) == has_gpu
      assert set(row["kernel_ms_by_kind"]) <= {"fwd", "dq", "dkv", "cudnn", "xla"}


def test_kernel_kinds_from_trace_names():
  from experiments.dispatch_probe import _kernel_kind
  names = {"moba_fwd_hopper_mosaic_gpu_kernel": "fwd", "moba_dq_hopper_mosaic_gpu_kernel": "dq",
           "moba_dkv_hopper_mosaic_gpu_kernel": "dkv", "cudnn_generated_fort_native_sdpa": "cudnn",
           "input_reduce_fusion_4": "xla"}
  assert {n: _kernel_kind(n) for n in names} == names


def test_timeline_ranks_gaps_and_sums_them_by_neighbours():
  """Kernels a 0-100, b 110-210, a 240-340, b 345-445, c 465-500 over two steps: gaps of 10
  (a -> b), 30 (b -> a), 5 (a -> b) and 20 (b -> c); the top 3 gaps longest first, idle time
  summed per neighbour pair (a -> b: 15) and ranked the same way. A host event overlapping a
  gap's start is among what runs while the GPU waits."""
  kernels = [("a", 0, 100), ("b", 110, 100), ("a", 240, 100), ("b", 345, 100), ("c", 465, 35)]
  trace = {"traceEvents": _PROCESSES + [_x(2, 14, n, dur, ts) for n, ts, dur in kernels] + [
      _x(1, 1, "memcpy", 15, ts=200), _x(1, 1, "cuLaunchKernel", 10, ts=215)]}
  tl = timeline(trace, steps=2, top=3)
  assert tl["span_ms_per_step"] == pytest.approx(0.250)
  assert tl["busy_ms_per_step"] == pytest.approx(0.435 / 2)
  assert tl["idle_ms_per_step"] == pytest.approx(0.065 / 2)
  assert list(tl["idle_us_by_neighbours"].items()) == [
      ("b -> a", pytest.approx(30.0)), ("b -> c", pytest.approx(20.0)),
      ("a -> b", pytest.approx(15.0))]
  assert [(g["gap_us"], g["before"], g["after"]) for g in tl["longest_gaps"]] == [
      (pytest.approx(30.0), "b", "a"), (pytest.approx(20.0), "b", "c"),
      (pytest.approx(10.0), "a", "b")]
  assert sorted(tl["longest_gaps"][0]["host_events"]) == [("cuLaunchKernel", 1), ("memcpy", 1)]


def test_sync_phases_of_a_trace_listed_out_of_time_order_with_two_streams():
  """Three calls (dispatch, GPU span, wake-up: 40/500/20, 60/700/10, 50/600/30 us), the
  trace's events listed latest first (a trace groups them by thread, not by time); each call
  runs a long kernel on one stream and, starting after it, a short one on another that ends
  first: the GPU span ends at the last kernel to end, not the last to start."""
  events = []
  for start, dispatch, gpu, wake in ((0, 40, 500, 20), (10_000, 60, 700, 10),
                                     (20_000, 50, 600, 30)):
    events += [_x(1, 1, "PjitFunction(step)", 30, ts=start),
               _x(1, 1, "PjitFunction(step)", 20, ts=start + 5),
               _x(2, 14, "long", gpu, ts=start + dispatch),
               _x(2, 15, "short", 50, ts=start + dispatch + 10),
               _x(1, 1, "$api.py:2757 block_until_ready", dispatch + gpu + wake - 30,
                  ts=start + 30)]
  phases = sync_phases({"traceEvents": _PROCESSES + [_meta(2, "Stream #15(Compute)", tid=15)]
                        + events[::-1]})
  assert phases["calls"] == 3
  assert phases["dispatch"] == pytest.approx(0.050)
  assert phases["gpu_span"] == pytest.approx(0.600)
  assert phases["wake_up"] == pytest.approx(0.020)
  assert phases["call"] == pytest.approx(0.680)  # of 0.560, 0.770, 0.680


def _clock(monkeypatch, name, seconds_by_fn):
  """Replaces dispatch_probe's `name` timer: each call returns the next of its function's
  seconds and is recorded as (function, keyword arguments)."""
  left = {fn: iter(seconds) for fn, seconds in seconds_by_fn.items()}
  asked = []

  def timer(fn, *operands, **kwargs):
    asked.append((fn, kwargs))
    return next(left[fn])

  monkeypatch.setattr(dispatch_probe, name, timer)
  return asked


def _two_calls():
  return {"add": (jax.jit(lambda x: x + 1), (jnp.ones(4),)),
          "mul": (jax.jit(lambda x: x * 2), (jnp.ones(4),))}


def test_interleaved_summary_of_scripted_rounds(monkeypatch):
  """Four rounds of scripted synchronised medians per call, timed in turn (add, mul, add, ...)
  with `reps` repeats after one warm-up: the rounds in ms in round order, their median (of an
  even count, the upper middle one, as sync_phases'), min and max."""
  fns = _two_calls()
  rng = np.random.default_rng()
  seconds = {name: rng.uniform(1e-4, 1e-2, 4).tolist() for name in fns}
  asked = _clock(monkeypatch, "time_call", {fns[n][0]: s for n, s in seconds.items()})
  out = interleaved(fns, rounds=4, reps=3)
  assert asked == [(fns[n][0], {"warmup": 1, "repeats": 3}) for _ in range(4) for n in fns]
  for name, row in out.items():
    ms = [1e3 * s for s in seconds[name]]
    assert row["rounds_ms"] == ms
    assert (row["min_ms"], row["median_ms"], row["max_ms"]) == (min(ms), sorted(ms)[2], max(ms))


def test_timings_report_each_calls_synchronised_and_back_to_back_ms(monkeypatch):
  fns = _two_calls()
  rng = np.random.default_rng()
  sync, pipe = rng.uniform(1e-4, 1e-2, (2, 2)).tolist()
  asked_sync = _clock(monkeypatch, "time_call", {fns["add"][0]: [sync[0]],
                                                 fns["mul"][0]: [sync[1]]})
  asked_pipe = _clock(monkeypatch, "time_pipelined", {fns["add"][0]: [pipe[0]],
                                                      fns["mul"][0]: [pipe[1]]})
  out = dispatch_probe.timings(fns, reps=7)
  assert out == {"add": {"sync_ms": 1e3 * sync[0], "pipelined_ms": 1e3 * pipe[0]},
                 "mul": {"sync_ms": 1e3 * sync[1], "pipelined_ms": 1e3 * pipe[1]}}
  assert [kw for _, kw in asked_sync] == [{"warmup": 2, "repeats": 7}] * 2
  assert [kw for _, kw in asked_pipe] == [{"calls": 20, "repeats": 3}] * 2


def test_pipeline_rounds_read_the_gpu_timeline_per_step(monkeypatch):
  """With the trace's GPU kernels given (fwd 0-100, dq 100-300, an XLA fusion 320-400 us for
  4 calls) and the clocks scripted: per step, the span, busy and idle time and each kernel
  kind's time in ms; back-to-back and synchronised times in ms."""
  fns = {"add": _two_calls()["add"]}
  fn = fns["add"][0]
  rng = np.random.default_rng()
  sync, pipe = rng.uniform(1e-4, 1e-2, (2, 2)).tolist()
  _clock(monkeypatch, "time_call", {fn: sync})
  asked_pipe = _clock(monkeypatch, "time_pipelined", {fn: pipe})
  kernels = [(0.0, 100.0, "moba_fwd_kernel"), (100.0, 300.0, "moba_dq_kernel"),
             (320.0, 400.0, "input_fusion")]
  monkeypatch.setattr(dispatch_probe, "stream_kernels", lambda trace: kernels)
  (rows,) = pipeline_rounds(fns, rounds=2, calls=4).values()
  assert [kw for _, kw in asked_pipe] == [{"calls": 4, "repeats": 1}] * 2
  for row, s, p in zip(rows, sync, pipe):
    assert row["pipelined_ms"] == 1e3 * p and row["sync_ms"] == 1e3 * s
    assert row["span_ms_per_step"] == pytest.approx(0.400 / 4)
    assert row["busy_ms_per_step"] == pytest.approx(0.380 / 4)
    assert row["idle_ms_per_step"] == pytest.approx(0.020 / 4)
    assert row["kernel_ms_by_kind"] == pytest.approx({"fwd": 0.025, "dq": 0.050, "xla": 0.020})
    assert row["traced_wall_ms"] > 0
