"""The native library where its build or cache goes wrong: a cache
directory that cannot be written, a cached library that is truncated, one
built for another CPU, two processes building at once, no C compiler. Each
decodes fairseq's hypotheses: rebuilt where it can be, else PyTorch's ops
after one warning. And what the library tells Python: its header's
constants, its checks of the tensors it is given."""

import shutil
import subprocess
import sys

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from fairseq_hardattn import kernels
from fairseq_hardattn.decoding import PluginBeamSearch
from fairseq_hardattn.kernels import build
from fairseq_hardattn.modules import ATTENTION_KINDS
from fairseq_hardattn.modules.cached_projection import CachedProjectionAttention

from conftest import assert_same_hypotheses, decisive_model, make_dictionary, sample_of, tool_env


@pytest.fixture(scope="module")
def compiled_objects(tmp_path_factory):
    """The library's compiled objects, as a cache keeps them: this
    environment's cache's (``make venv`` built it), completed by a build
    (which compiles only what they lack); a rebuild below then links."""
    cache = tmp_path_factory.mktemp("kernel-objects")
    if (build.cache_dir() / build.OBJECTS).is_dir():
        shutil.copytree(build.cache_dir() / build.OBJECTS, cache / build.OBJECTS)
    subprocess.run([sys.executable, "-c", BUILD], env=tool_env(FAIRSEQ_HARDATTN_KERNEL_DIR=str(cache)),
                   check=True, capture_output=True, timeout=900)
    return cache / build.OBJECTS


def seeded_with(objects, cache):
    """A cache folder holding ``objects`` and no library."""
    shutil.copytree(objects, cache / build.OBJECTS)
    return cache


@pytest.fixture
def fresh_kernels(monkeypatch, tmp_path):
    """A process state with no library loaded, its cache in ``tmp_path / cache``."""
    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.setenv("FAIRSEQ_HARDATTN_KERNEL_DIR", str(tmp_path / "cache"))
    if hasattr(build._private_dir, "path"):
        monkeypatch.delattr(build._private_dir, "path")
    return tmp_path / "cache"


def decodes_fairseqs_hypotheses():
    d = make_dictionary(40)
    model = decisive_model("transformer_hard_dec_small", d).float()
    sample = sample_of(d)
    with torch.no_grad():
        ours = PluginBeamSearch([model], d, beam_size=4, max_len_b=12).generate([model], sample)
        theirs = SequenceGenerator([model], d, beam_size=4, max_len_b=12).generate([model], sample)
    assert_same_hypotheses(ours, theirs)


def kernel_warnings(caplog):
    return [r.getMessage() for r in caplog.records if "fairseq-hardattn:" in r.getMessage()]


def decodes_with_a_rebuilt_library_after_one_warning(caplog, says):
    with caplog.at_level("WARNING"):
        decodes_fairseqs_hypotheses()
    assert kernels.available()
    warnings = kernel_warnings(caplog)
    assert len(warnings) == 1 and says in warnings[0], warnings


@pytest.mark.slow
@pytest.mark.xdist_group("kernel-builds")  # (one build of the objects for the three)
def test_a_cache_that_cannot_be_written_builds_in_a_directory_of_the_process(fresh_kernels, tmp_path,
                                                                             monkeypatch, caplog):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("FAIRSEQ_HARDATTN_KERNEL_DIR", str(blocked / "kernels"))
    decodes_with_a_rebuilt_library_after_one_warning(caplog, "cannot write the kernel cache")


@pytest.mark.slow
@pytest.mark.xdist_group("kernel-builds")  # (one build of the objects for the three)
def test_a_truncated_cached_library_is_built_again(fresh_kernels, compiled_objects, caplog):
    seeded_with(compiled_objects, fresh_kernels)
    path = build.library_path()
    path.write_bytes(b"\x7fELF" + b"\0" * 200)
    decodes_with_a_rebuilt_library_after_one_warning(caplog, "do not load")
    assert sorted(p.name for p in (fresh_kernels / build.OBJECTS).iterdir()) == sorted(
        p.name for p in compiled_objects.iterdir())  # (nothing compiled again)


def test_a_library_built_for_another_cpu_or_pytorch_is_never_loaded_here(fresh_kernels, monkeypatch):
    here = build.library_path()
    monkeypatch.setattr(build, "_cpu_signature", lambda: b"flags : another cpu")
    elsewhere = build.library_path()
    monkeypatch.undo()
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    other_torch = build.library_path()
    assert len({here, elsewhere, other_torch}) == 3


def test_no_c_compiler_decodes_with_pytorchs_ops_after_one_warning(fresh_kernels, monkeypatch, caplog):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with caplog.at_level("WARNING"):
        decodes_fairseqs_hypotheses()
        decodes_fairseqs_hypotheses()
    warnings = kernel_warnings(caplog)
    assert len(warnings) == 1
    assert "native kernels are unavailable (no C compiler found" in warnings[0]
    assert "using PyTorch ops instead" in warnings[0]


BUILD = "from fairseq_hardattn.kernels import build; print(build.build())"


@pytest.mark.slow
@pytest.mark.xdist_group("kernel-builds")  # (one build of the objects for the three)
def test_two_processes_building_at_once_both_load_a_whole_library(tmp_path, compiled_objects):
    seeded_with(compiled_objects, tmp_path)
    env = tool_env(FAIRSEQ_HARDATTN_KERNEL_DIR=str(tmp_path))
    processes = [subprocess.Popen([sys.executable, "-c", BUILD], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=600) for p in processes]
    assert all(p.returncode == 0 for p in processes), [o[1][-1500:] for o in outputs]
    assert outputs[0][0] == outputs[1][0]
    built = sorted(path.name for path in tmp_path.iterdir() if path.name != build.OBJECTS)
    assert len(built) == 1 and built[0].endswith(".so")  # nothing half-built left
    check = subprocess.run([sys.executable, "-c", "import sys; from fairseq_hardattn.kernels import build; "
                            "print(build.load_module(sys.argv[1]).ATTENTION_MODES)", outputs[0][0].strip()],
                           env=env, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_the_headers_modes_are_those_the_attention_classes_declare():
    """The attention modes reach Python from native.h; every kernel mode an
    attention class declares is one of them."""
    if not kernels.available():
        pytest.skip("no native library here")
    declared = {kind.kernel_mode for kind in ATTENTION_KINDS.values()
                if isinstance(kind, type) and issubclass(kind, CachedProjectionAttention) and kind.kernel_mode}
    assert declared and declared <= set(kernels.native().ATTENTION_MODES)
    assert sorted(kernels.native().ATTENTION_MODES.values()) == list(range(len(kernels.native().ATTENTION_MODES)))


def test_the_module_refuses_what_its_kernels_cannot_read():
    """A tensor of another dtype, a non-contiguous one where rows are read
    in place, an argument missing or misnamed: a Python error naming it,
    before any kernel runs."""
    module = kernels.native()
    if module is None:
        pytest.skip("no native library here")
    logits = torch.randn(3, 20)
    out = torch.empty(3, 4), torch.empty(3, 4, dtype=torch.int64), torch.empty(3, 1)
    columns, adds = torch.tensor([1]), torch.tensor([float("nan")])
    with pytest.raises(ValueError, match="logits: dtype Float"):
        module.beam_candidates(logits.double(), columns, adds, 4, *out)
    with pytest.raises(ValueError, match="rows contiguous"):
        module.beam_candidates(logits.t(), columns, adds, 4, *out)
    with pytest.raises(ValueError, match="1 <= k <= vocab"):
        module.beam_candidates(logits, columns, adds, 21, *out)
    with pytest.raises(TypeError):
        module.Attention(q=(torch.randn(4, 4), None), out=(torch.randn(4, 4), None), heads=1, head_dim=4, scale=1.0,
                         mode=0, top_k=0)  # k and v missing
    with pytest.raises(ValueError, match="an attention mode"):
        module.Attention(q=(torch.randn(4, 4), None), k=None, v=None, out=(torch.randn(4, 4), None), heads=1,
                         head_dim=4, scale=1.0, mode=len(module.ATTENTION_MODES), top_k=0)
