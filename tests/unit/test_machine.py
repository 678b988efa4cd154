"""The machine (rufus/machine/cpu.py) and the compile caches keyed by it (rufus/machine/caches.py)."""

from __future__ import annotations

from rufus.machine import caches
from rufus.machine import cpu as machine

AVX2 = "processor: 0\nflags\t\t: fpu sse2 avx avx2 fma bmi2\nprocessor: 1\n"
AVX512_BF16 = "flags\t\t: fpu avx2 fma avx512f avx512bw avx512vl avx512_vnni avx512_bf16\n"
AMX = AVX512_BF16.rstrip() + " amx_tile amx_bf16 amx_int8\n"
ARM = "Features\t: fp asimd evtstrm aes sve\n"


def test_cpu_classes_from_cpuinfo():
    assert machine.cpu_class(machine.cpu_flags(AVX2)) == "avx2"
    assert machine.cpu_class(machine.cpu_flags(AVX512_BF16)) == "avx512-bf16"
    assert machine.cpu_class(machine.cpu_flags("flags : avx2 avx512f")) == "avx512"
    assert machine.cpu_class(machine.cpu_flags(AMX)) == "amx"
    assert machine.cpu_class(machine.cpu_flags(ARM)) == "arm-sve"
    assert machine.cpu_class(machine.cpu_flags("flags : fpu sse2")) == "baseline"
    assert machine.cpu_flags("") == set()


def test_classes_never_share_a_compile_directory(tmp_path):
    env = {"RUFUS_CACHE_DIR": str(tmp_path)}
    a = caches.compile_dirs(dict(env), machine.cpu_flags(AVX2))
    b = caches.compile_dirs(dict(env), machine.cpu_flags(AVX512_BF16))
    c = caches.compile_dirs(dict(env), machine.cpu_flags("flags : avx2 fma"))  # same ISA
    assert set(a) == {"VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"}
    assert a["VLLM_CACHE_ROOT"] != b["VLLM_CACHE_ROOT"]
    assert a["VLLM_CACHE_ROOT"] == c["VLLM_CACHE_ROOT"]
    assert all(p.startswith(str(tmp_path / "compile")) for p in a.values())


def test_operator_settings_win_and_configure_sets_the_environment(tmp_path):
    env = {"RUFUS_CACHE_DIR": str(tmp_path), "VLLM_CACHE_ROOT": "/mine"}
    dirs = caches.configure(env)
    assert env["VLLM_CACHE_ROOT"] == "/mine" == dirs["VLLM_CACHE_ROOT"]
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith(str(tmp_path / "compile"))


def test_a_capped_isa_is_its_own_class(tmp_path):
    """ATEN_CPU_CAPABILITY=avx2 on an AVX-512 CPU builds AVX2 kernels: they go with AVX2."""
    flags = machine.cpu_flags(AVX512_BF16)
    capped = machine.effective_flags(flags, {"ATEN_CPU_CAPABILITY": "avx2"})
    assert machine.cpu_class(capped) == "avx2"
    assert machine.effective_flags(flags, {}) == flags
    env = {"RUFUS_COMPILE_CACHE_DIR": str(tmp_path / "cc"), "ATEN_CPU_CAPABILITY": "avx2"}
    dirs = caches.compile_dirs(env, flags)
    assert dirs == caches.compile_dirs({"RUFUS_COMPILE_CACHE_DIR": str(tmp_path / "cc")},
                                       machine.cpu_flags(AVX2))
    assert "-avx2-" in dirs["VLLM_CACHE_ROOT"]


def test_describe_names_the_class_and_bf16():
    d = machine.describe({"ATEN_CPU_CAPABILITY": "avx2"})
    assert d["native_bf16"] == "false" and d["cpu_class"] in ("avx2", "baseline", "arm", "arm-sve")
    assert machine.native_bf16(machine.cpu_flags(AVX512_BF16))
    assert not machine.native_bf16(machine.cpu_flags(AVX2))
    assert int(d["cores"]) >= 1


def test_the_answer_engine_takes_every_core_only_without_native_bf16():
    from rufus.serving.engine_processes import every_core_binding

    avx2, amx = {"avx2", "fma"}, {"avx2", "avx512f", "avx512_bf16", "amx_bf16"}
    assert every_core_binding(avx2, [0, 1], env={}) == "0,1"
    assert every_core_binding(avx2, [2, 3, 1], env={"VLLM_CPU_OMP_THREADS_BIND": "auto"}) == "1,2,3"
    assert every_core_binding(amx, [0, 1], env={}) is None           # vLLM's: one for the planner
    assert every_core_binding(avx2, [0], env={}) is None              # one core: nothing to add
    assert every_core_binding(avx2, [0, 1], env={"VLLM_CPU_OMP_THREADS_BIND": "1"}) is None
    # emulated AVX2 on an AMX machine is AVX2 for this choice (ATEN_CPU_CAPABILITY caps flags)
    from rufus.machine.cpu import effective_flags

    capped = effective_flags(amx, {"ATEN_CPU_CAPABILITY": "avx2"})
    assert every_core_binding(capped, [0, 1], env={}) == "0,1"
