"""The per-phase profile command (zsim.validation.gpu_phases): its quick mode end to end on
CPU (tiny model, rank 0 of 8 on the fake process group), the budget guard, the run list
against shared/cases/h200-fsdp2-runs.yaml, and the interval and name helpers."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

pytest.importorskip("torch")
yaml = pytest.importorskip("yaml")

from zsim.validation import gpu_phases  # noqa: E402


def _read(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


@pytest.mark.slow
def test_quick_mode_end_to_end(tmp_path: Path) -> None:
    assert gpu_phases.main(["--out", str(tmp_path), "--quick", "--budget-s", "120"]) == 0
    names = [p.run.name for p in gpu_phases.runs(True, "cpu")]
    steps = gpu_phases.QUICK_STEPS.profiled

    header, phases = _read(tmp_path / "phases.csv")
    assert header == list(gpu_phases.PHASE_FIELDS)
    assert {(r["run"], r["step"], r["phase"]) for r in phases} == {
        (n, str(k), p) for n in names for k in range(steps)
        for p in (*gpu_phases.PHASES, "step")}
    for r in phases:
        where = (r["run"], r["step"], r["phase"])
        assert r["note"] == "" and r["device"] == "cpu", where
        assert float(r["wall_s"]) > 0 and float(r["profiled_wall_s"]) > 0, where
        assert float(r["host_issue_s"]) <= float(r["wall_s"]), where
        busy, wall = float(r["device_busy_s"]), float(r["profiled_wall_s"])
        assert 0 < busy <= wall, where
        assert float(r["device_idle_s"]) == pytest.approx(wall - busy, abs=1e-5), where
        assert int(r["kernels"]) > 0 and int(r["aten_ops"]) >= int(r["kernels"]), where
        assert float(r["compute_busy_s"]) <= busy + 1e-9, where
    # The phases partition the step.
    for name in names:
        for k in range(steps):
            got = {r["phase"]: r for r in phases if r["run"] == name and r["step"] == str(k)}
            assert sum(int(got[p]["kernels"]) for p in gpu_phases.PHASES) == int(
                got["step"]["kernels"])
            assert sum(float(got[p]["profiled_wall_s"]) for p in gpu_phases.PHASES) <= float(
                got["step"]["profiled_wall_s"])

    header, classes = _read(tmp_path / "kernel_classes.csv")
    assert header == list(gpu_phases.CLASS_FIELDS)
    for r in phases:
        mine = [c for c in classes
                if (c["run"], c["step"], c["phase"]) == (r["run"], r["step"], r["phase"])]
        assert [c["kernel_class"] for c in mine] == list(gpu_phases.KERNEL_CLASSES)
        assert sum(int(c["kernels"]) for c in mine) == int(r["kernels"])
    by_class = {(c["run"], c["phase"], c["kernel_class"]): int(c["kernels"])
                for c in classes if c["step"] == "0"}
    for name in names:
        assert by_class[(name, "forward", "gemm")] > 0  # aten::linear
        assert by_class[(name, "backward", "gemm")] > 0  # aten::mm
        assert by_class[(name, "forward", "attention")] > 0
        assert by_class[(name, "optimizer", "optimizer")] > 0  # AdamW's foreach ops
        assert by_class[(name, "forward", "copies")] > 0  # FSDP2's all-gather copy-in/out

    header, kernels = _read(tmp_path / "kernel_names.csv")
    assert header == list(gpu_phases.KERNEL_FIELDS)
    # Every kernel of a phase, by stream and launching op: they add up to its classes.
    for r in phases:
        if r["phase"] == "step":
            continue
        where = (r["run"], r["step"], r["phase"])
        mine = [x for x in kernels if (x["run"], x["step"], x["phase"]) == where]
        assert sum(int(x["calls"]) for x in mine) == int(r["kernels"]), where
        for cls in gpu_phases.KERNEL_CLASSES:
            (c,) = [c for c in classes if (c["run"], c["step"], c["phase"]) == where
                    and c["kernel_class"] == cls]
            assert sum(float(x["device_s"]) for x in mine if x["kernel_class"] == cls) == \
                pytest.approx(float(c["device_s"]), rel=1e-4, abs=1e-6), (where, cls)
    assert any(x["aten_op"] == "aten::mm" for x in kernels)

    header, gemms = _read(tmp_path / "gemm_shapes.csv")
    assert header == list(gpu_phases.GEMM_FIELDS)
    assert all(float(g["device_s"]) > 0 and float(g["flops"]) > 0 for g in gemms)
    for k in range(steps):
        flops = {p: sum(float(g["flops"]) for g in gemms if g["run"] == "tiny_n8"
                        and g["step"] == str(k) and g["phase"] == p) for p in gpu_phases.PHASES}
        # Every forward matmul has a data-gradient and a weight-gradient matmul of its size.
        assert flops["forward"] > 0 and flops["optimizer"] == 0
        assert flops["backward"] == pytest.approx(2 * flops["forward"], rel=1e-4)

    provenance = yaml.safe_load((tmp_path / "provenance.yaml").read_text())
    assert provenance["state"] == "done" and provenance["quick"] is True
    assert "--quick" in provenance["command"] and provenance["environment"]["torch"]
    assert [(r["run"], r["status"]) for r in provenance["results"]] == [
        (n, "ok") for n in names]


def test_spent_budget_skips_every_run_and_still_writes(tmp_path: Path) -> None:
    gpu_phases.run_phases(tmp_path, quick=True, budget_s=0.0)
    provenance = yaml.safe_load((tmp_path / "provenance.yaml").read_text())
    assert provenance["state"] == "done" and provenance["failures"]
    assert {r["status"] for r in provenance["results"]} == {"skipped"}
    assert not (tmp_path / "phases.csv").exists()


def test_run_list_matches_the_published_runs(cases_dir: Path) -> None:
    published = {r["name"]: r for r in yaml.safe_load(
        (cases_dir / "h200-fsdp2-runs.yaml").read_text())["runs"]}
    planned = gpu_phases.runs(False, "cuda")
    assert [p.run.name for p in planned] == [
        "1p3b_n8", "1p3b_n64", "7b_n8", "13b_n128_mb1", "1p3b_n8_ac", "1p3b_n8_raf0",
        "1p3b_n8_fp32", "1p3b_n8_offload"]
    for p in planned:
        case, spec, plan = published[p.run.published], p.run.spec, p.run.plan
        assert p.run.published == p.run.name
        assert (spec.num_layers, spec.d_model, spec.num_heads, spec.num_kv_heads,
                spec.ffn_hidden, spec.vocab_size) == tuple(case["model"][k] for k in (
                    "layers", "d_model", "heads", "kv_heads", "ffn_hidden", "vocab"))
        assert (p.world_size, plan.world_size, plan.seq_len, plan.micro_batch,
                plan.param_dtype, plan.reshard_after_forward) == (
            case["plan"]["world_size"], case["plan"]["world_size"], case["plan"]["seq"],
            case["plan"]["micro_batch"], case["plan"]["precision"],
            case["plan"]["reshard_after_forward"]), p.run.name
        # The fp32 run has TF32 matmuls (the file's setup.fp32_case).
        assert p.run.tf32 == (case["plan"]["precision"] == "fp32")
        assert plan.recompute == {"none": "none", "full": "full"}[
            case["plan"]["activation_checkpointing"]]
        assert (plan.offload != "none") == case["plan"]["cpu_offload"]
        assert plan.strategy in ("fsdp", "fsdp-no-reshard")
    groups = gpu_phases.by_world_size(planned)
    assert [(w, [p.run.name for p in g]) for w, g in groups] == [
        (8, ["1p3b_n8", "7b_n8", "1p3b_n8_ac", "1p3b_n8_raf0", "1p3b_n8_fp32",
             "1p3b_n8_offload"]),
        (64, ["1p3b_n64"]),
        (128, ["13b_n128_mb1"])]


def test_intervals() -> None:
    spans = [(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (5.5, 5.7), (10.0, 10.0)]
    assert gpu_phases.union_us(spans) == 4.0
    assert gpu_phases.union_us([]) == 0.0
    assert gpu_phases.gaps_us(spans) == [2.0, 4.0]


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
    assert gpu_phases.kernel_class(name) == cls


def test_gemm_flops() -> None:
    assert gpu_phases.gemm_flops("aten::mm", [[8192, 2048], [2048, 5632]]) == (
        2.0 * 8192 * 2048 * 5632)
    assert gpu_phases.gemm_flops("aten::addmm", [[5632], [8192, 2048], [2048, 5632], [], []]) == (
        2.0 * 8192 * 2048 * 5632)
    assert gpu_phases.gemm_flops("aten::bmm", [[4, 16, 32], [4, 32, 8]]) == 2.0 * 4 * 16 * 32 * 8
    assert gpu_phases.gemm_flops("aten::mm", [[], []]) == 0.0


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
    trace = gpu_phases.read_trace(events, cuda=True)
    (windows,) = trace.steps
    assert windows["forward"] == [(0.0, 400.0)] and windows["step"] == [(0.0, 1000.0)]

    fwd = gpu_phases.phase_stats(trace, windows["forward"])
    assert fwd["kernels"] == 3 and fwd["streams"] == 2 and fwd["launches"] == 2
    assert fwd["aten_ops"] == 2
    assert fwd["device_busy_s"] == pytest.approx(150e-6)  # union of 50-150, 100-180, 160-200
    assert fwd["device_idle_s"] == pytest.approx(250e-6)
    assert fwd["lead_s"] == pytest.approx(50e-6) and fwd["tail_s"] == pytest.approx(200e-6)
    assert fwd["blocked_s"] == pytest.approx(50e-6)
    assert fwd["compute_stream"] == 7 and fwd["compute_busy_s"] == pytest.approx(140e-6)
    assert fwd["compute_idle_s"] == pytest.approx(10e-6)
    assert fwd["compute_gaps_over_10us"] == 0

    bwd = gpu_phases.phase_stats(trace, windows["backward"])
    assert bwd["kernels"] == 2 and bwd["device_busy_s"] == pytest.approx(170e-6)
    step = gpu_phases.phase_stats(trace, windows["step"])
    assert step["kernels"] == 6 and step["compute_gaps_over_10us"] == 2  # 200->450, 620->920

    classes = {r["kernel_class"]: r for r in gpu_phases.class_rows(trace, windows["forward"])}
    assert classes["gemm"]["device_s"] == pytest.approx(100e-6)
    assert classes["elementwise"]["kernels"] == 1 and classes["copies"]["kernels"] == 1
    assert classes["other"]["kernels"] == 0
    opt = {r["kernel_class"]: r for r in gpu_phases.class_rows(trace, windows["optimizer"])}
    assert opt["optimizer"]["busy_s"] == pytest.approx(60e-6)

    (fmm,) = gpu_phases.gemm_rows(trace, windows["forward"])
    assert (fmm["op"], fmm["calls"], fmm["kernels"], fmm["kernel"]) == ("aten::mm", 1, 1, gemm)
    assert fmm["device_s"] == pytest.approx(100e-6)
    assert fmm["flops"] == 2.0 * 64 * 32 * 16
    assert fmm["tflops"] == pytest.approx(2.0 * 64 * 32 * 16 / 100e-6 / 1e12)
    (bmm,) = gpu_phases.gemm_rows(trace, windows["backward"])
    assert bmm["kernels"] == 2 and bmm["kernel"] == gemm
    assert bmm["device_s"] == pytest.approx(170e-6)
    assert gpu_phases.gemm_rows(trace, windows["optimizer"]) == []
