"""The GPU kernels (kernels/gpu_ops.py): each custom op equals its PyTorch
reference, and the references equal what the modules compute. On a GPU the
Triton kernels run (skipped without CUDA); where Triton is installed, its
interpreter runs the same kernels on the CPU (TRITON_INTERPRET=1), in a
process of its own, and decoding with them gives the same hypotheses."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from fairseq_hardattn.kernels import gpu_ops
from fairseq_hardattn.modules import FlexibleAttention, HardRetrievalAttention, decoding_step

from conftest import REPO, tool_env

try:
    import triton
    import triton.language as tl
    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False

# the marker of an interpreter that cannot run our kernels' loops (a Triton bug,
# not ours): Triton 3.6's takes int() of a 1-element array for a runtime loop
# bound, which numpy >= 2.4 refuses (Triton 3.9's squeezes it first)
BROKEN_INTERPRETER = "Triton's interpreter cannot loop to a runtime bound"

if HAS_TRITON:
    @triton.jit
    def _count_to(out, n):  # the probe: a loop to a runtime bound, as the kernels' over keys
        total = 0
        for _ in range(0, n):
            total += 1
        tl.store(out, total)

HEADS, SENTENCES, BEAM, SRC_LEN = 4, 3, 2, 23


def case(head_dim=16, device="cpu", dtype=torch.float32, seed=0):
    """Query rows, time-major keys and batch-major values (both layouts the
    modules hand over), the rows' K/V rows, and left padding."""
    g = torch.Generator().manual_seed(seed)
    rows = SENTENCES * BEAM * HEADS
    q = torch.randn(rows, head_dim, generator=g)
    k = torch.randn(SRC_LEN, SENTENCES * HEADS, head_dim, generator=g).transpose(0, 1)
    v = torch.randn(SENTENCES * HEADS, SRC_LEN, head_dim, generator=g)
    r = torch.arange(rows)
    kv_rows = (r // (BEAM * HEADS)) * HEADS + r % HEADS
    padding = torch.zeros(SENTENCES, SRC_LEN, dtype=torch.bool)
    padding[1, :7] = True
    centre = 7 + torch.rand(rows, generator=g) * (SRC_LEN - 8)  # within the unpadded keys
    centre[:2] = torch.tensor([8.5, 9.5])  # ties of rounding: half to even
    gate = torch.rand(rows, generator=g)
    move = lambda t: t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)  # noqa
    return [move(t) for t in (q, k, v, kv_rows, padding, centre, gate)]


def test_the_references_are_what_the_modules_compute():
    torch.manual_seed(0)
    d = 8 * HEADS
    key = torch.randn(SRC_LEN, SENTENCES, d, dtype=torch.float64)
    key = key.repeat_interleave(BEAM, dim=1)
    pad = torch.zeros(SENTENCES, SRC_LEN, dtype=torch.bool)
    pad[1, :7] = True
    pad = pad.repeat_interleave(BEAM, dim=0)
    query = torch.randn(1, SENTENCES * BEAM, d, dtype=torch.float64)
    for module in (HardRetrievalAttention(d, HEADS, encoder_decoder_attention=True),
                   FlexibleAttention(d, HEADS, encoder_decoder_attention=True, threshold=0.8)):
        module = module.double().eval()
        state = {}
        decoding_step.set_hypotheses_per_sentence(state, BEAM)
        expected, _ = module(query, key, key, key_padding_mask=pad, static_kv=True,
                             incremental_state=state)
        p = module.project(query, None, None, None, state, static_kv=True)
        rows = module.value_rows(p.bsz, p.kv_bsz, query.device)
        if isinstance(module, HardRetrievalAttention):
            out = gpu_ops.hard_retrieval_reference(p.q[:, 0], p.k, p.v, rows, p.key_padding_mask,
                                                   HEADS)
        else:
            first = (~p.key_padding_mask).to(torch.int8).argmax(-1).double()
            centre = first.repeat_interleave(BEAM * HEADS)
            gate = module.gates(query).permute(1, 2, 0).reshape(-1)
            out, _, _ = gpu_ops.flexible_band_reference(
                p.q[:, 0], p.k, p.v, rows, p.key_padding_mask, HEADS, centre, gate,
                module.scaling, module.sigma, module.threshold)
        torch.testing.assert_close(module.merge_heads(out.unsqueeze(1), 1, p.bsz), expected)


def check_ops(device, dtype):
    q, k, v, kv_rows, padding, centre, gate = case(device=device, dtype=dtype)
    for pad in (padding, None):
        out = gpu_ops.hard_retrieval_step(q, k, v, kv_rows, pad, HEADS)
        torch.testing.assert_close(out, gpu_ops.hard_retrieval_reference(q, k, v, kv_rows, pad, HEADS))
    for tau in (0.5, 1.5, 50.0):
        found = gpu_ops.flexible_band_step(q, k, v, kv_rows, padding, HEADS, centre, gate, 0.25,
                                           3.0, tau)
        expected = gpu_ops.flexible_band_reference(q, k, v, kv_rows, padding, HEADS, centre, gate,
                                                   0.25, 3.0, tau)
        tolerance = dict(rtol=2e-2, atol=2e-2) if dtype == torch.float16 else {}
        torch.testing.assert_close(found[0], expected[0], **tolerance)
        torch.testing.assert_close(found[1], expected[1], **tolerance)
        assert torch.equal(found[2], expected[2])  # the band sizes (CPS)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_kernels_equal_the_references_on_a_gpu(dtype):
    assert gpu_ops.available(torch.empty(0, device="cuda"))
    check_ops("cuda", dtype)


INTERPRETED = textwrap.dedent("""
    import sys, torch
    sys.path[:0] = [{tests!r}, {unit!r}]
    from test_gpu_kernels import BROKEN_INTERPRETER, _count_to, check_ops
    from triton.runtime.errors import InterpreterError
    from fairseq_hardattn.kernels import gpu_ops
    count = torch.zeros(1, dtype=torch.int32)
    try:
        _count_to[(1,)](count, 3)
    except InterpreterError as error:
        if "0-dimensional" not in str(error):
            raise
        print(BROKEN_INTERPRETER, repr(error))
        sys.exit(0)
    assert count.item() == 3, count
    assert gpu_ops.available(torch.empty(0))
    check_ops("cpu", torch.float32)
    # decoding through the modules, kernels on (interpreted) and off
    from fairseq.sequence_generator import SequenceGenerator
    from conftest import build_model, make_dictionary, random_batch
    d = make_dictionary()
    for arch in ("transformer_hard_dec", "transformer_flexible"):
        torch.manual_seed(0)
        model = build_model(arch, d).float().eval()
        src, lengths, _ = random_batch(d, [7, 5, 3], seed=1)
        sample = {{"net_input": {{"src_tokens": src, "src_lengths": lengths}}}}
        generator = SequenceGenerator([model], d, beam_size=3, max_len_b=6)
        with torch.no_grad():
            kernels = [[h["tokens"].tolist() for h in hs] for hs in generator.generate(None, sample)]
            gpu_ops.available = lambda tensor: False
            plain = [[h["tokens"].tolist() for h in hs] for hs in generator.generate(None, sample)]
            gpu_ops.available = lambda tensor: True
        assert kernels == plain, arch
    print("interpreted kernels ok")
""")


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed (CUDA builds of torch ship it)")
def test_the_kernels_equal_the_references_in_tritons_interpreter():
    proc = subprocess.run(
        [sys.executable, "-c", INTERPRETED.format(tests=str(REPO / "tests"), unit=os.path.dirname(__file__))],
        env=tool_env(TRITON_INTERPRET="1", FAIRSEQ_HARDATTN_KERNELS="0"), cwd=REPO,
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    if BROKEN_INTERPRETER in proc.stdout:
        pytest.skip(proc.stdout.strip())
    assert "interpreted kernels ok" in proc.stdout
