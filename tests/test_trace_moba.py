"""The trace reader of experiments/trace_moba.py on a hand-made Chrome-format trace."""

import json

import pytest

from experiments import trace_moba
from experiments.trace_moba import device_kernel_times, host_event_times, kernel_group, step_spans


def _meta(pid, name, tid=None):
  e = {"ph": "M", "pid": pid, "name": "thread_name" if tid is not None else "process_name",
       "args": {"name": name}}
  if tid is not None:
    e["tid"] = tid
  return e


def _x(pid, tid, name, dur, ts=0.0):
  return {"ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur, "name": name}


def test_sums_stream_kernels_only():
  trace = {"traceEvents": [
      _meta(1, "/host:CPU"), _meta(1, "python", tid=1),
      _meta(2, "/device:GPU:0"), _meta(2, "Stream #14(Compute)", tid=14),
      _meta(2, "Stream #15(MemcpyD2D)", tid=15), _meta(2, "XLA Ops", tid=99),
      _x(1, 1, "PjitFunction(step)", 500.0),            # host: ignored
      _x(2, 14, "moba_fwd", 100.0), _x(2, 14, "moba_fwd", 110.0),
      _x(2, 14, "loop_gather_fusion", 7.0), _x(2, 15, "memcpy", 3.0),
      _x(2, 99, "fusion.1", 210.0),                      # derived line: per thread only
  ]}
  kernels, threads = device_kernel_times(trace)
  assert kernels == {"moba_fwd": (210.0, 2), "loop_gather_fusion": (7.0, 1), "memcpy": (3.0, 1)}
  assert threads == {"Stream #14(Compute)": 217.0, "Stream #15(MemcpyD2D)": 3.0, "XLA Ops": 210.0}


def test_no_gpu_process_is_an_error():
  with pytest.raises(ValueError, match="no /device:GPU"):
    device_kernel_times({"traceEvents": [_meta(1, "/host:CPU"), _x(1, 1, "f", 1.0)]})


def test_step_spans_split_steps_at_the_longest_gaps():
  """Two steps 1000 us apart: the first runs kernels at 0-10, 12-20 (2 idle) and, on a second
  stream, 15-30 (overlapping: no idle); the second at 1030-1040 and 1045-1050 (5 idle)."""
  gpu = [_meta(2, "/device:GPU:0"), _meta(2, "Stream #14(Compute)", tid=14),
         _meta(2, "Stream #15(Compute)", tid=15), _meta(2, "XLA Ops", tid=99)]
  kernels = [(14, 0, 10), (14, 12, 8), (15, 15, 15), (14, 1030, 10), (14, 1045, 5),
             (99, 100, 500)]  # derived line: ignored
  trace = {"traceEvents": gpu + [_x(2, tid, "k", dur, ts) for tid, ts, dur in kernels]}
  span, idle = step_spans(trace, reps=2)
  assert span == pytest.approx((30 + 20) / 2)
  assert idle == pytest.approx((2 + 5) / 2)
  with pytest.raises(ValueError, match="cannot make"):
    step_spans(trace, reps=9)


def test_host_events_rank_the_non_gpu_processes():
  trace = {"traceEvents": [
      _meta(1, "/host:CPU"), _meta(1, "python", tid=1), _meta(2, "/device:GPU:0"),
      _meta(2, "Stream #14(Compute)", tid=14),
      _x(1, 1, "PjitFunction(step)", 50.0), _x(1, 1, "Execute", 30.0), _x(1, 1, "Execute", 40.0),
      _x(2, 14, "moba_fwd", 900.0)]}  # a GPU kernel: not host time
  assert host_event_times(trace, top=5) == [("Execute", 70.0, 2), ("PjitFunction(step)", 50.0, 1)]
  assert host_event_times(trace, top=1) == [("Execute", 70.0, 2)]


def test_kernel_groups_from_trace_names():
  names = {"moba_fwd_hopper_mosaic_gpu_kernel": "moba_pallas", "moba_gate_topk": "moba_pallas",
           "moba_dkv": "moba_pallas",
           "nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NNT": "matmul_library",
           "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64": "matmul_library",
           "cutlass_80_wmma_tensorop_bf16_s161616gemm": "matmul_library",
           "ncclDevKernel_AllReduce_Sum_f32_RING_LL": "collectives",
           "loop_multiply_fusion_3": "xla_other", "input_reduce_fusion_8": "xla_other"}
  assert {n: kernel_group(n) for n in names} == names


def test_step_spans_gap_runs_from_the_latest_end():
  """A gap starts at the latest end so far, not the previous kernel's: step 1 holds a long
  kernel (0-1000) with two short ones inside it (10-20, 900-950), step 2 starts at 1100 (a
  100 us gap; from the short kernel's end 150, and 880 inside the long one)."""
  gpu = [_meta(2, "/device:GPU:0"), _meta(2, "Stream #14(Compute)", tid=14),
         _meta(2, "Stream #15(Compute)", tid=15)]
  kernels = [(14, 0, 1000), (15, 10, 10), (15, 900, 50), (14, 1100, 10), (14, 1120, 10)]
  trace = {"traceEvents": gpu + [_x(2, tid, "k", dur, ts) for tid, ts, dur in kernels]}
  span, idle = step_spans(trace, reps=2)
  assert span == pytest.approx((1000 + 30) / 2)
  assert idle == pytest.approx((0 + 10) / 2)


def test_main_reports_per_step_times_and_the_gating_share(tmp_path, monkeypatch):
  """main()'s JSON from fixed traces of 4 steps (the tracing itself replaced; nothing runs):
  the step's kernels 3 + 1 ms in all (per step 0.75 and 0.25 ms), the gating alone 0.6 ms
  (0.15 per step): its share 0.15 of the step's kernel time; spans and host events per step."""
  traced = iter([
      ({"moba_fwd": (3000.0, 4), "loop_fusion": (1000.0, 8)}, {"Stream #1": 4000.0},
       (1500.0, 200.0), [("Execute", 400.0, 4)]),
      ({"moba_gate_topk": (400.0, 4), "sort": (200.0, 4)}, {"Stream #1": 600.0},
       (700.0, 100.0), [("Execute", 80.0, 4)])])
  monkeypatch.setattr(trace_moba, "traced_kernel_us", lambda fn, *args, reps: next(traced))
  out = tmp_path / "trace.json"
  monkeypatch.setattr("sys.argv", ["trace_moba", "--seq", "256", "--block", "64", "--k", "2",
                                   "--heads", "tiny", "--reps", "4", "--interpret",
                                   "--out", str(out)])
  trace_moba.main()
  got = json.loads(out.read_text())
  assert got["kernel_ms_per_step"] == pytest.approx(1.0, rel=1e-12)
  assert got["rows"] == [
      dict(kernel="moba_fwd", ms_per_step=pytest.approx(0.75), launches_per_step=1.0,
           share=pytest.approx(0.75)),
      dict(kernel="loop_fusion", ms_per_step=pytest.approx(0.25), launches_per_step=2.0,
           share=pytest.approx(0.25))]
  assert got["gating_kernel_ms"] == pytest.approx(0.15, rel=1e-12)
  assert got["gating_share"] == pytest.approx(0.15, rel=1e-12)
  assert got["gating_rows"] == {"moba_gate_topk": pytest.approx(0.1), "sort": pytest.approx(0.05)}
  assert (got["step_span_ms"], got["step_idle_ms"]) == (pytest.approx(1.5), pytest.approx(0.2))
  assert (got["gating_span_ms"], got["gating_idle_ms"]) == (pytest.approx(0.7),
                                                              pytest.approx(0.1))
  assert got["host_events_ms_per_step"] == [["Execute", pytest.approx(0.1), 1.0]]
  assert got["thread_ms_per_step"] == {"Stream #1": pytest.approx(1.0)}
  assert (got["seq"], got["k"], got["k_max"], got["reps"]) == (256, 2, 2, 4)
