"""The JIT caches a GPU call carries to the next (``tests/gpu/jit_cache.sh``): a call carries at most 64 MiB, the
wheelhouse and the tracked tree take ~59, so the packs hold only what a server start loads. FlashInfer's built
modules (``cached_ops/NAME/NAME.so``) go stripped, without the generated sources and objects beside them; Triton's
kernels go as their group file, metadata and cubin, without their IR; both come back where they were."""

import os
import shutil
import subprocess
import sysconfig

import pytest

JIT_CACHE_SH = os.path.join(os.path.dirname(__file__), "gpu", "jit_cache.sh")
MODULE = ".cache/flashinfer/0.6.15.post1/90a/cached_ops/batch_prefill_hd256/batch_prefill_hd256.so"
KERNEL = "triton/27FXPCCWFIFACZVVGL7QF7WJXBIYIOYPEFJNC77OU5SNGLB443PA"
KEPT = [MODULE, f"{KERNEL}/__grp___tree_conv_kernel.json", f"{KERNEL}/_tree_conv_kernel.json",
        f"{KERNEL}/_tree_conv_kernel.cubin"]  # fmt: skip
LEFT = [".cache/flashinfer/0.6.15.post1/90a/generated/batch_prefill_hd256/kernel.cu",
        ".cache/flashinfer/0.6.15.post1/90a/cached_ops/batch_prefill_hd256/kernel.cuda.o",
        f"{KERNEL}/_tree_conv_kernel.ptx", f"{KERNEL}/_tree_conv_kernel.llir", f"{KERNEL}/_tree_conv_kernel.ttgir"]


def bash(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f"source {JIT_CACHE_SH}; {script}"], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


DEBUG_SECTION = ".debug_jit_cache_test"
TOOLS = ("xz", "strip", "objcopy", "readelf", "nm")
needs_tools = pytest.mark.skipif(any(shutil.which(t) is None for t in TOOLS), reason=f"needs {', '.join(TOOLS)}")


@pytest.fixture
def jit(tmp_path):
    """A JIT folder as a GPU call leaves it. The module is a real shared library (one of the interpreter's own)
    given a debug section of 20 kB, as an nvcc build carries debug sections."""
    root = tmp_path / "jit"
    extensions = sysconfig.get_config_var("DESTSHARED")
    shared_library = os.path.join(extensions, next(f for f in sorted(os.listdir(extensions)) if f.endswith(".so")))
    for path in KEPT + LEFT:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        if path != MODULE:
            (root / path).write_text(path)
    (tmp_path / "debug").write_bytes(os.urandom(20_000))
    subprocess.run(["objcopy", "--add-section", f"{DEBUG_SECTION}={tmp_path / 'debug'}", "--set-section-flags",
                    f"{DEBUG_SECTION}=noload,readonly", shared_library, str(root / MODULE)], check=True)  # fmt: skip
    return root


def sections(path) -> str:
    return subprocess.run(["readelf", "-SW", str(path)], capture_output=True, text=True, check=True).stdout


@needs_tools
def test_the_packs_hold_what_a_server_loads_and_come_back_where_they_were(jit, tmp_path):
    packs = tmp_path / "packs"
    packs.mkdir()
    assert bash(f"pack_jit_cache {packs} {jit}").returncode == 0
    assert sorted(os.listdir(packs)) == ["jitcache_flashinfer.txz", "jitcache_triton.txz"]
    restored = tmp_path / "restored"
    assert bash(f"restore_jit_cache {packs} {restored}").returncode == 0
    files = sorted(str(p.relative_to(restored)) for p in restored.rglob("*") if p.is_file())
    assert files == sorted([*KEPT, ".restored"])
    for path in KEPT[1:]:
        assert (restored / path).read_text() == path
    assert DEBUG_SECTION in sections(jit / MODULE) and DEBUG_SECTION not in sections(restored / MODULE)  # stripped
    assert (restored / MODULE).stat().st_size < (jit / MODULE).stat().st_size - 20_000
    dynamic_symbols = subprocess.run(["nm", "-D", str(restored / MODULE)], capture_output=True, text=True).stdout
    assert "PyInit_" in dynamic_symbols  # what the loader needs is kept


@needs_tools
def test_a_machine_restores_its_packs_once(jit, tmp_path):
    """A warm machine keeps its JIT folder between calls: the packs of a later call do not overwrite it."""
    restored = tmp_path / "restored"
    assert bash(f"restore_jit_cache {tmp_path / 'none'} {restored}").returncode == 0
    (restored / "triton").mkdir()
    (restored / "triton" / "built_here").write_text("kept")
    packs = tmp_path / "packs"
    packs.mkdir()
    bash(f"pack_jit_cache {packs} {jit}")
    assert bash(f"restore_jit_cache {packs} {restored}").returncode == 0
    assert sorted(p.name for p in restored.rglob("*") if p.is_file()) == [".restored", "built_here"]
