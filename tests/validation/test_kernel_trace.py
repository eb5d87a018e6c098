"""Reading a profile by phase (zsim.validation.kernel_trace): interval unions and gaps, the
kernel classes of real CUDA kernel and ATen op names, GEMM FLOPs from recorded shapes,
and a made-up CUDA trace whose every figure is worked by hand."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from zsim.validation import kernel_trace


def test_intervals() -> None:
    spans = [(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (5.5, 5.7), (10.0, 10.0)]
    assert kernel_trace.union_us(spans) == 4.0
    assert kernel_trace.union_us([]) == 0.0
    assert kernel_trace.gaps_us(spans) == [2.0, 4.0]


@pytest.mark.parametrize(("name", "cls"), [
    ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNN", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x1>",
     "gemm"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, cutlass::bfloat16_t>>",
     "attention"),
    ("fmha_cutlassB_bf16_aligned_64x64_k128_sm80", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", "attention"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>",
     "elementwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>", "elementwise"),
    ("Memcpy HtoD (Pageable -> Device)", "copies"),
    ("Memset (Device)", "copies"),
    ("void at::native::(anonymous namespace)::chunk_cat_cuda_kernel<float, float>", "copies"),
    ("void at::native::split_with_sizes_copy_out_contiguous_no_cast_kernel<c10::BFloat16>",
     "copies"),
    ("void at::native::multi_tensor_apply_kernel<TensorListMetadata<2>, CopyFunctor<float>>",
     "copies"),
    ("void at::native::multi_tensor_apply_kernel<TensorListMetadata<4>, FusedAdamMathFunctor>",
     "optimizer"),
    ("void at::native::multi_tensor_apply_kernel<TensorListMetadata<3>, PointwiseOpListFunctor>",
     "optimizer"),
    ("void cub::DeviceRadixSortOnesweepKernel<Policy900, false>", "other"),
    ("aten::linear", "gemm"), ("aten::scaled_dot_product_attention", "attention"),
    ("aten::_foreach_copy_", "copies"), ("aten::_foreach_sqrt", "optimizer"),
    ("aten::rms_norm", "elementwise"), ("aten::empty", "other"),
])
def test_kernel_classes(name: str, cls: str) -> None:
    assert kernel_trace.kernel_class(name) == cls


def test_gemm_flops() -> None:
    assert kernel_trace.gemm_flops("aten::mm", [[8192, 2048], [2048, 5632]]) == (
        2.0 * 8192 * 2048 * 5632)
    assert kernel_trace.gemm_flops("aten::addmm", [[5632], [8192, 2048], [2048, 5632], [], []]) == (
        2.0 * 8192 * 2048 * 5632)
    assert kernel_trace.gemm_flops("aten::bmm", [[4, 16, 32], [4, 32, 8]]) == 2.0 * 4 * 16 * 32 * 8
    assert kernel_trace.gemm_flops("aten::mm", [[], []]) == 0.0


class _Event:
    """A stand-in for torch's _KinetoEvent (the methods read_trace calls)."""

    def __init__(self, name: str, start_us: float, end_us: float, *, cuda: bool = False,
                 lane: int = 1, corr: int = 0, link: int = 0, shapes: list | None = None,
                 annotation: bool = False) -> None:
        self._name, self._start, self._end = name, start_us, end_us
        self._cuda, self._lane, self._corr, self._link = cuda, lane, corr, link
        self._shapes, self._annotation = shapes or [], annotation

    def name(self) -> str:
        return self._name

    def device_type(self) -> object:
        from torch.autograd import DeviceType

        return DeviceType.CUDA if self._cuda else DeviceType.CPU

    def start_ns(self) -> int:
        return int(1_000_000_000 + self._start * 1000)

    def duration_ns(self) -> int:
        return int((self._end - self._start) * 1000)

    def start_thread_id(self) -> int:
        return 1

    def device_resource_id(self) -> int:
        return self._lane

    def correlation_id(self) -> int:
        return self._corr

    def linked_correlation_id(self) -> int:
        return self._link

    def shapes(self) -> list:
        return self._shapes

    def is_user_annotation(self) -> bool:
        return self._annotation


def test_cuda_trace_is_read_by_phase() -> None:
    """A made-up CUDA profile: kernels on a compute and a copy stream, GPU annotations
    (not device work), GEMM kernels attributed to their ATen op by correlation id."""
    gemm = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
    events = [
        _Event("zsim::step", 0, 1000, annotation=True),
        _Event("zsim::forward", 0, 400, annotation=True),
        _Event("zsim::backward", 400, 900, annotation=True),
        _Event("zsim::optimizer", 900, 1000, annotation=True),
        _Event("FSDP::pre_forward", 5, 30, annotation=True),
        _Event("aten::mm", 10, 20, corr=10, shapes=[[64, 32], [32, 16]]),
        _Event("cudaLaunchKernel", 12, 14, link=10),
        _Event("aten::add", 20, 25, corr=11),
        _Event("cudaLaunchKernel", 21, 23, link=11),
        _Event("cudaDeviceSynchronize", 350, 400),
        _Event("aten::mm", 410, 420, corr=20, shapes=[[64, 16], [16, 32]]),
        _Event("cudaLaunchKernel", 411, 412, link=20),
        _Event("cudaLaunchKernel", 413, 414, link=20),
        _Event("aten::_foreach_add_", 905, 910, corr=30),
        # Device side.
        _Event("zsim::forward", 50, 200, cuda=True, lane=7, annotation=True),
        _Event("FSDP::pre_forward", 40, 390, cuda=True, lane=7, annotation=True),
        _Event(gemm, 50, 150, cuda=True, lane=7, link=10),
        _Event("void at::native::vectorized_elementwise_kernel<4, add>", 160, 200, cuda=True,
               lane=7, link=11),
        _Event("void at::native::chunk_cat_cuda_kernel<float>", 100, 180, cuda=True, lane=20,
               link=12),
        _Event(gemm, 450, 600, cuda=True, lane=7, link=20),
        _Event("cutlass::Kernel2<splitKreduce_kernel>", 600, 620, cuda=True, lane=7, link=20),
        _Event("void at::native::multi_tensor_apply_kernel<TensorListMetadata<3>, "
               "PointwiseOpListFunctor>", 920, 980, cuda=True, lane=7, link=30),
    ]
    trace = kernel_trace.read_trace(events, cuda=True)
    (windows,) = trace.steps
    assert windows["forward"] == [(0.0, 400.0)] and windows["step"] == [(0.0, 1000.0)]

    fwd = kernel_trace.phase_stats(trace, windows["forward"])
    assert fwd["kernels"] == 3 and fwd["streams"] == 2 and fwd["launches"] == 2
    assert fwd["aten_ops"] == 2
    assert fwd["device_busy_s"] == pytest.approx(150e-6)  # union of 50-150, 100-180, 160-200
    assert fwd["device_idle_s"] == pytest.approx(250e-6)
    assert fwd["lead_s"] == pytest.approx(50e-6) and fwd["tail_s"] == pytest.approx(200e-6)
    assert fwd["blocked_s"] == pytest.approx(50e-6)
    assert fwd["compute_stream"] == 7 and fwd["compute_busy_s"] == pytest.approx(140e-6)
    assert fwd["compute_idle_s"] == pytest.approx(10e-6)
    assert fwd["compute_gaps_over_10us"] == 0

    bwd = kernel_trace.phase_stats(trace, windows["backward"])
    assert bwd["kernels"] == 2 and bwd["device_busy_s"] == pytest.approx(170e-6)
    step = kernel_trace.phase_stats(trace, windows["step"])
    assert step["kernels"] == 6 and step["compute_gaps_over_10us"] == 2  # 200->450, 620->920

    classes = {r["kernel_class"]: r for r in kernel_trace.class_rows(trace, windows["forward"])}
    assert classes["gemm"]["device_s"] == pytest.approx(100e-6)
    assert classes["elementwise"]["kernels"] == 1 and classes["copies"]["kernels"] == 1
    assert classes["other"]["kernels"] == 0
    opt = {r["kernel_class"]: r for r in kernel_trace.class_rows(trace, windows["optimizer"])}
    assert opt["optimizer"]["busy_s"] == pytest.approx(60e-6)

    (fmm,) = kernel_trace.gemm_rows(trace, windows["forward"])
    assert (fmm["op"], fmm["calls"], fmm["kernels"], fmm["kernel"]) == ("aten::mm", 1, 1, gemm)
    assert fmm["device_s"] == pytest.approx(100e-6)
    assert fmm["flops"] == 2.0 * 64 * 32 * 16
    assert fmm["tflops"] == pytest.approx(2.0 * 64 * 32 * 16 / 100e-6 / 1e12)
    (bmm,) = kernel_trace.gemm_rows(trace, windows["backward"])
    assert bmm["kernels"] == 2 and bmm["kernel"] == gemm
    assert bmm["device_s"] == pytest.approx(170e-6)
    assert kernel_trace.gemm_rows(trace, windows["optimizer"]) == []
