"""The C kernels where their build or cache goes wrong: a cache directory
that cannot be written, a cached library that is truncated, one built for
another CPU, two processes building at once, no C compiler. Each decodes
fairseq's hypotheses: rebuilt where it can be, else PyTorch's ops after one
warning."""

import subprocess
import sys

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from fairseq_hardattn import kernels
from fairseq_hardattn.decoding import PluginBeamSearch

from conftest import assert_same_hypotheses, decisive_model, make_dictionary, sample_of, tool_env

SEARCH_KERNELS = ("beam_candidates", "step_attention", "decoder_sublayers", "layer_norm")


@pytest.fixture
def fresh_kernels(monkeypatch, tmp_path):
    """A process state with no kernel loaded, its cache in ``tmp_path / cache``."""
    monkeypatch.setattr(kernels, "_loaded", {})
    monkeypatch.setenv("FAIRSEQ_HARDATTN_KERNEL_DIR", str(tmp_path / "cache"))
    if hasattr(kernels._private_dir, "path"):
        monkeypatch.delattr(kernels._private_dir, "path")
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


def decodes_with_rebuilt_kernels_after_one_warning_each(caplog, says):
    with caplog.at_level("WARNING"):
        decodes_fairseqs_hypotheses()
    assert all(kernels.load(name) is not None for name in SEARCH_KERNELS)
    warnings = kernel_warnings(caplog)
    assert len(warnings) == len(SEARCH_KERNELS) and all(says in w for w in warnings)


@pytest.mark.slow
def test_a_cache_that_cannot_be_written_builds_in_a_directory_of_the_process(fresh_kernels, tmp_path,
                                                                             monkeypatch, caplog):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("FAIRSEQ_HARDATTN_KERNEL_DIR", str(blocked / "kernels"))
    decodes_with_rebuilt_kernels_after_one_warning_each(caplog, "cannot write the kernel cache")


@pytest.mark.slow
def test_a_truncated_cached_library_is_built_again(fresh_kernels, caplog):
    for name in SEARCH_KERNELS:
        path = kernels.build(name)
        path.write_bytes(path.read_bytes()[:200])
    decodes_with_rebuilt_kernels_after_one_warning_each(caplog, "does not load")


@pytest.mark.slow
def test_a_library_built_for_another_cpu_is_never_loaded_here(fresh_kernels, monkeypatch):
    here = kernels.build("step_attention")
    monkeypatch.setattr(kernels, "_cpu_signature", lambda: b"flags : another cpu")
    elsewhere = kernels.build("step_attention")
    assert here != elsewhere and here.exists() and elsewhere.exists()


def test_no_c_compiler_decodes_with_pytorchs_ops_after_one_warning_per_kernel(fresh_kernels, monkeypatch,
                                                                            caplog):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with caplog.at_level("WARNING"):
        decodes_fairseqs_hypotheses()
        decodes_fairseqs_hypotheses()
    warnings = kernel_warnings(caplog)
    assert sorted(w.split()[4] for w in warnings) == sorted(SEARCH_KERNELS)
    assert all("no C compiler found" in w and "using PyTorch ops instead" in w for w in warnings)


BUILD = ("import sys; from fairseq_hardattn import kernels; "
         "print(*[kernels.build(n) for n in ('beam_candidates', 'step_attention', 'flexible_band')])")


@pytest.mark.slow
def test_two_processes_building_at_once_both_load_whole_libraries(tmp_path):
    env = tool_env(FAIRSEQ_HARDATTN_KERNEL_DIR=str(tmp_path))
    processes = [subprocess.Popen([sys.executable, "-c", BUILD], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in processes]
    assert all(p.returncode == 0 for p in processes), [o[1][-1500:] for o in outputs]
    assert outputs[0][0] == outputs[1][0]
    built = sorted(path.name for path in tmp_path.iterdir())
    assert len(built) == 3 and all(name.endswith(".so") for name in built)  # nothing half-built left
    check = subprocess.run([sys.executable, "-c", "import ctypes, sys; [ctypes.CDLL(p) for p in sys.argv[1:]]",
                            *outputs[0][0].split()], env=env, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_every_kernel_binding_agrees_with_its_c_prototype_and_a_wrong_one_is_refused():
    """Each C function is called by its parameters' names, in the order and
    with the types its C definition declares (read from the source at load);
    a binding that swaps two parameters, or gives a float for an int64, is
    refused before any call, and a call that misses a name fails by name."""
    import ctypes

    for kernel in kernels.KERNELS:
        source = kernels.SOURCE_DIR / f"{kernel.library}.c"
        assert kernels.c_prototype(source.read_text(), kernel.name) == list(kernel.parameters)
        kernels.check_signature(kernel, source)
    step = kernels.STEP_ATTENTION
    swapped = list(step.parameters)
    swapped[1], swapped[2] = swapped[2], swapped[1]
    retyped = [(name, ctypes.c_float if name == "rows" else kind) for name, kind in step.parameters]
    for parameters in (swapped, retyped):
        wrong = kernels.Kernel(step.library, step.name, parameters, step.returns)
        with pytest.raises(RuntimeError, match="disagrees with step_attention.c"):
            wrong.function()
    with pytest.raises(TypeError, match=r"missing \['positions'\]"):
        kernels.STEP_ATTENTION_THREADS(rows=1, heads=1, dim=1)
