"""experiments/trace_train.py: the kinds its kernel table sums by."""

from experiments.trace_train import kernel_kind


def test_kernel_kinds_from_trace_names():
    names = {"moba_fwd_hopper_mosaic_gpu_kernel": "moba_pallas", "moba_gate_topk": "moba_pallas",
             "moba_dkv": "moba_pallas",
             "nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NNT": "matmul_library",
             "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64": "matmul_library",
             "cutlass_80_wmma_tensorop_bf16_s161616gemm": "matmul_library",
             "ncclDevKernel_AllReduce_Sum_f32_RING_LL": "collectives",
             "loop_multiply_fusion_3": "xla_other", "input_reduce_fusion_8": "xla_other"}
    assert {n: kernel_kind(n) for n in names} == names
