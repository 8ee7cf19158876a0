"""Batches decoded in parallel (``--decoding-workers``): the read-ahead of
fairseq's iterators, worker processes that give the hypotheses one process
gives, in the same order, through fairseq-generate, fairseq-interactive and
the hub; errors and dead workers; never in training; and several threads
decoding with one model and one generator."""

import functools
import gc
import logging
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import weakref

import pytest
import torch

import fairseq_hardattn
from fairseq_hardattn import ConfigError
from fairseq_hardattn.decoding import PluginBeamSearch, PluginBeamSearchWithAlignment, read_ahead, workers
from fairseq_hardattn.models.decoding_options import check_workers

from conftest import (USER_DIR, assert_same_batches, assert_same_hypotheses, assert_same_output,
                      decisive_model, generate, interactive, make_dictionary, one_error_line, random_batch,
                      train)

ENGINE = "'decoding_engine': 'auto'"


def batches_of(dictionary, count=5, size=3, seed=0):
    samples = []
    for b in range(count):
        lengths = [3 + (b + i) % 6 for i in range(size)]
        src, src_lengths, _ = random_batch(dictionary, lengths, seed=seed + b)
        samples.append({"id": torch.arange(b * size, (b + 1) * size),
                        "net_input": {"src_tokens": src, "src_lengths": src_lengths}})
    return samples


def prepared_model(arch="transformer_soft_small", decoding_workers=2):
    d = make_dictionary(40)
    model = decisive_model(arch, d).float()
    model.decoding_workers = decoding_workers
    model.prepared_for_inference = True  # as fairseq's tools leave it
    return model, d


def decode_as_fairseq_generate(generator, samples):
    """fairseq-generate's loop: a CountingIterator, one batch per call."""
    found = []
    with torch.no_grad():
        for sample in read_ahead.LookaheadCountingIterator(samples):
            found.append(generator.generate(generator.model.models, sample, prefix_tokens=None,
                                            constraints=None))
    return found


def hypotheses_of(batches):
    """Every sentence's n-best list, in order (the contract compares them)."""
    return [sentence for batch in batches for sentence in batch]


def test_decoding_workers_takes_auto_or_a_count():
    assert check_workers(None) == check_workers("auto") == "auto"
    assert check_workers("3") == check_workers(3) == 3
    for bad in ("0", 0, -2, "two", "2.5", 1.5):
        with pytest.raises(ConfigError, match="--decoding-workers must be 'auto' or a number >= 1"):
            check_workers(bad)


def test_a_counting_iterator_reads_ahead_and_still_yields_every_batch_once_in_order():
    items = [{"net_input": {"src_tokens": torch.tensor([i])}} for i in range(6)]
    iterator = read_ahead.LookaheadCountingIterator(items)
    first = next(iterator)
    assert read_ahead.batches_after(first, 2) == items[1:3]
    assert read_ahead.batches_after(items[4], 2) == []  # not the batch it yielded last
    assert [next(iterator) for _ in range(2)] == items[1:3]
    assert read_ahead.batches_after(items[2], 10) == items[3:]
    assert list(iterator) == items[3:] and iterator.n == len(items)


def test_interactive_batches_read_ahead_as_samples():
    from fairseq_cli.interactive import Batch

    batches = [Batch(ids=torch.tensor([i]), src_tokens=torch.tensor([[i + 4, 2]]),
                     src_lengths=torch.tensor([2]), constraints=None) for i in range(4)]
    iterator = read_ahead.InteractiveBatches(iter(batches))
    first = next(iterator)
    sample = {"net_input": {"src_tokens": first.src_tokens, "src_lengths": first.src_lengths}}
    ahead = read_ahead.batches_after(sample, 2)
    assert [a["net_input"]["src_tokens"] for a in ahead] == [b.src_tokens for b in batches[1:3]]
    assert list(iterator) == batches[1:]


@pytest.mark.parametrize("arch", ["transformer_soft_small", "transformer_hard_dec_prenorm_small",
                                  "transformer_cross_self_small", "transformer_aan_small"])
def test_workers_give_one_processs_hypotheses_in_its_order(arch):
    model, d = prepared_model(arch)
    samples = batches_of(d)
    serial = PluginBeamSearch([model], d, beam_size=3, max_len_b=8)
    serial.model.models[0].decoding_workers = 1
    alone = hypotheses_of(decode_as_fairseq_generate(serial, samples))
    model.decoding_workers = 2
    generator = PluginBeamSearch([model], d, beam_size=3, max_len_b=8)
    together = hypotheses_of(decode_as_fairseq_generate(generator, samples))
    pool = generator._pool
    assert len(pool.processes) == 2 and all(p.pid != os.getpid() for p in pool.processes)
    assert_same_hypotheses(together, alone)
    generator.close_workers()
    assert not any(p.is_alive() for p in pool.processes)


def test_alignments_are_computed_in_the_workers_too():
    model, d = prepared_model()
    samples = batches_of(d, count=4)
    found = {}
    for count in (1, 2):
        model.decoding_workers = count
        generator = PluginBeamSearchWithAlignment([model], d, beam_size=2, max_len_b=6,
                                                  print_alignment="hard")
        found[count] = [[h["alignment"] for h in sentence]
                        for batch in decode_as_fairseq_generate(generator, samples) for sentence in batch]
        assert (generator.__dict__.get("_pool") is not None) == (count == 2)
    assert found[1] == found[2]


def test_the_objects_are_frozen_while_batches_are_out_and_in_the_workers(monkeypatch):
    # the cyclic collector's full passes would scan them all in every process
    model, d = prepared_model()
    samples = batches_of(d, count=4)

    def frozen_here(self, models, sample, **kwargs):  # in a worker: inherited by the fork
        return [[{"frozen": gc.get_freeze_count(), "pid": os.getpid()}]] * len(sample["id"])

    monkeypatch.setattr(PluginBeamSearch, "serial_generate", frozen_here)
    for frozen_before in (False, True):
        if frozen_before:  # a process that freezes objects itself: as it left them
            gc.freeze()
        generator = PluginBeamSearch([model], d, beam_size=2, max_len_b=6)
        found, frozen_here_after = [], []
        with torch.no_grad():
            for sample in read_ahead.LookaheadCountingIterator(samples):
                found += [h for sentence in generator.generate([model], sample) for h in sentence]
                frozen_here_after.append(gc.get_freeze_count() > 1000)
        assert all(h["frozen"] > 1000 and h["pid"] != os.getpid() for h in found)
        # frozen while batches read ahead are out; after the last, as before
        assert frozen_here_after == [True, True, True, frozen_before]
        generator.close_workers()
        assert (gc.get_freeze_count() > 1000) == frozen_before
        gc.unfreeze()


def test_a_few_batches_a_prefix_or_an_unprepared_model_decode_here():
    model, d = prepared_model()
    samples = batches_of(d, count=2 * workers.TASKS_A_WORKER_TO_START)  # enough for 2 workers
    generator = PluginBeamSearch([model], d, beam_size=2, max_len_b=6)
    with torch.no_grad():
        generator.generate([model], samples[0])  # not from a lookahead source
        for sample in read_ahead.LookaheadCountingIterator(samples):  # a prefix: every call as it is
            generator.generate([model], sample, prefix_tokens=torch.full((3, 1), 5))
        decode_as_fairseq_generate(generator, samples[:1])  # the only batch
        # fewer batches than the workers would gain on (a hub call of a few sentences)
        few = hypotheses_of(decode_as_fairseq_generate(generator, samples[:-1]))
    assert generator.__dict__.get("_pool") is None
    assert_same_hypotheses(hypotheses_of(decode_as_fairseq_generate(generator, samples))[:len(few)], few)
    assert generator.__dict__.get("_pool") is not None  # enough of them: the workers start
    generator.close_workers()
    model.prepared_for_inference = False  # training: --eval-bleu's weights change between calls
    unprepared = PluginBeamSearch([model], d, beam_size=2, max_len_b=6)
    decode_as_fairseq_generate(unprepared, samples)
    assert unprepared.__dict__.get("_pool") is None


def test_a_worker_done_first_gets_more_batches_while_the_caller_waits_on_another(monkeypatch):
    """The caller waits for its batches in order; a worker whose batches are
    done meanwhile is given the next ones instead of idling behind a slow
    batch of the other worker. The output stays one process's, in order."""
    import time

    model, d = prepared_model()
    samples = batches_of(d, count=8)
    model.decoding_workers = 1
    alone = hypotheses_of(decode_as_fairseq_generate(PluginBeamSearch([model], d, beam_size=2, max_len_b=6),
                                                     samples))
    slow = samples[0]["net_input"]["src_tokens"].clone()

    def first_batch_slow(self, models, sample, _original=PluginBeamSearch.serial_generate, **kwargs):
        if torch.equal(sample["net_input"]["src_tokens"], slow):  # in a worker: inherited by the fork
            time.sleep(3)
        return _original(self, models, sample, **kwargs)

    events = []
    submit, result = workers.WorkerPool.submit, workers.WorkerPool.result

    def logged_result(pool, number, **kwargs):
        events.append(("wait", number))
        found = result(pool, number, **kwargs)
        events.append(("got", number))
        return found

    monkeypatch.setattr(PluginBeamSearch, "serial_generate", first_batch_slow)
    monkeypatch.setattr(workers.WorkerPool, "submit",
                        lambda pool, sample: events.append(("submit",)) or submit(pool, sample))
    monkeypatch.setattr(workers.WorkerPool, "result", logged_result)
    model.decoding_workers = 2
    generator = PluginBeamSearch([model], d, beam_size=2, max_len_b=6)
    together = hypotheses_of(decode_as_fairseq_generate(generator, samples))
    generator.close_workers()
    assert_same_hypotheses(together, alone)
    waiting_on_the_slow_one = events[events.index(("wait", 0)) + 1:events.index(("got", 0))]
    # the window holds 4 batches out; the other worker's were done and it got the rest
    assert waiting_on_the_slow_one.count(("submit",)) >= 2, events


def test_a_workers_error_reaches_the_caller(monkeypatch):
    model, d = prepared_model()
    samples = batches_of(d, count=4)
    bad = samples[2]["net_input"]["src_tokens"].clone()

    def failing(self, models, sample, _original=PluginBeamSearch.serial_generate, **kwargs):
        if torch.equal(sample["net_input"]["src_tokens"], bad):  # in a worker: inherited by the fork
            raise ValueError("this batch fails")
        return _original(self, models, sample, **kwargs)

    monkeypatch.setattr(PluginBeamSearch, "serial_generate", failing)
    generator = PluginBeamSearch([model], d, beam_size=2, max_len_b=6)
    iterator = read_ahead.LookaheadCountingIterator(samples)
    with torch.no_grad():
        for _ in range(2):
            sample = next(iterator)
            assert generator.generate([model], sample)
        with pytest.raises(ValueError, match="this batch fails"):
            generator.generate([model], next(iterator))
    generator.close_workers()


@pytest.mark.parametrize("moment", ["while they end", "as their objects are freed"])
def test_a_dropped_generators_workers_end_as_the_next_pool_starts_and_a_ctrl_c_then_reaches_the_caller(
        monkeypatch, moment):
    # the hub drops its generator after each call: ended by a finalizer, the
    # workers' ending ran wherever the collector freed it, and a Ctrl-C that
    # arrived then was raised there, only reported, never reaching the program
    model, d = prepared_model()
    generator = PluginBeamSearch([model], d, beam_size=2, max_len_b=6)
    decode_as_fairseq_generate(generator, batches_of(d, count=4))
    processes = [weakref.ref(p) for p in generator._pool.processes]
    pids = [p().pid for p in processes]
    lost = []
    monkeypatch.setattr(sys, "unraisablehook", lost.append)
    del generator
    gc.collect()  # the collector runs nothing of the plugin's
    assert all(p().is_alive() for p in processes) and lost == []

    def ctrl_c(*_):
        os.kill(os.getpid(), signal.SIGINT)

    join = multiprocessing.Process.join
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as a program run from a terminal
    try:
        with monkeypatch.context() as m:
            for process in map(weakref.ref.__call__, processes):
                if moment == "while they end":
                    m.setattr(process, "join", functools.partial(lambda p, timeout=None: (ctrl_c(), join(p, timeout)),
                                                                 process))
                else:  # a finalizer of the workers' objects (multiprocessing has such)
                    weakref.finalize(process, ctrl_c)
            del process
            following = PluginBeamSearch([model], d, beam_size=2, max_len_b=6)
            with pytest.raises(KeyboardInterrupt):
                decode_as_fairseq_generate(following, batches_of(d, count=4))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert lost == []
    for pid in pids:  # ended, and reaped
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    assert decode_as_fairseq_generate(following, batches_of(d, count=4))  # and it decodes, its workers started
    assert following._pool.processes and not {p.pid for p in following._pool.processes} & set(pids)
    following.close_workers()


def test_a_dead_worker_is_replaced_by_this_process_with_one_warning(caplog):
    model, d = prepared_model()
    samples = batches_of(d, count=6)
    model.decoding_workers = 1
    alone = hypotheses_of(decode_as_fairseq_generate(PluginBeamSearch([model], d, beam_size=2, max_len_b=6),
                                                     samples))
    model.decoding_workers = 2
    generator = PluginBeamSearch([model], d, beam_size=2, max_len_b=6)
    found = []
    with torch.no_grad():
        for i, sample in enumerate(read_ahead.LookaheadCountingIterator(samples)):
            found.append(generator.generate([model], sample))
            if i == 0:
                for process in generator._pool.processes:
                    process.kill()
                    process.join()
    assert_same_hypotheses(hypotheses_of(found), alone)
    warnings = [r.message for r in caplog.records if "decoding worker" in r.message]
    assert len(warnings) == 1 and "decoding the remaining batches in this process" in warnings[0]


def test_threads_decoding_with_one_model_and_one_generator_get_what_each_gets_alone():
    """A threaded server: each input's hypotheses as decoded alone, however
    the threads' steps interleave (each call keeps its own state; oneDNN's
    packing is shared while any call runs)."""
    model, d = prepared_model(decoding_workers=1)
    samples = batches_of(d, count=6)
    generator = PluginBeamSearch([model], d, beam_size=3, max_len_b=8)
    with torch.no_grad():
        alone = [hypotheses_of([generator.generate([model], s)]) for s in samples]
    found = [None] * len(samples)

    def decode(i):
        with torch.no_grad():
            for _ in range(3):
                found[i] = hypotheses_of([generator.generate([model], samples[i])])
                assert_same_hypotheses(found[i], alone[i])

    threads = [threading.Thread(target=decode, args=(i,)) for i in range(len(samples))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i in range(len(samples)):
        assert_same_hypotheses(found[i], alone[i])


@pytest.mark.forks_beside_threads
def test_threads_asking_for_workers_at_once_each_get_one_processs_hypotheses():
    """A threaded server whose model asks for workers: a thread forks only
    while no other decodes; every thread's batches decode as one process's."""
    model, d = prepared_model(decoding_workers=1)
    runs = [batches_of(d, count=4, seed=10 * t) for t in range(3)]
    alone = [hypotheses_of(decode_as_fairseq_generate(PluginBeamSearch([model], d, beam_size=3, max_len_b=8),
                                                      samples)) for samples in runs]
    model.decoding_workers = 2
    found, generators = [None] * len(runs), [None] * len(runs)

    def decode(t):
        generators[t] = PluginBeamSearch([model], d, beam_size=3, max_len_b=8)
        found[t] = hypotheses_of(decode_as_fairseq_generate(generators[t], runs[t]))

    threads = [threading.Thread(target=decode, args=(t,), daemon=True) for t in range(len(runs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    for t in range(len(runs)):
        assert_same_hypotheses(found[t], alone[t])
    for generator in generators:
        generator.close_workers()


@pytest.mark.forks_beside_threads
def test_a_thread_decoding_through_its_workers_keeps_other_threads_from_forking(monkeypatch):
    """While one thread's call waits on its workers, another thread's call
    decodes in its own thread: a fork then would copy the locks the first
    thread's PyTorch ops hold, locked, into the new workers."""
    model, d = prepared_model(decoding_workers=2)
    first, second = batches_of(d, count=4, seed=1), batches_of(d, count=4, seed=2)
    alone = hypotheses_of(decode_as_fairseq_generate(PluginBeamSearch([model], d, beam_size=3, max_len_b=8),
                                                     second))
    waiting, resume = threading.Event(), threading.Event()
    result = workers.WorkerPool.result

    def result_held_once(pool, number, **kwargs):  # the first thread, mid-call, waits for the second
        if not waiting.is_set():
            waiting.set()
            assert resume.wait(120)
        return result(pool, number, **kwargs)

    monkeypatch.setattr(workers.WorkerPool, "result", result_held_once)
    pooled = PluginBeamSearch([model], d, beam_size=3, max_len_b=8)
    thread = threading.Thread(target=decode_as_fairseq_generate, args=(pooled, first), daemon=True)
    thread.start()
    try:
        assert waiting.wait(120)
        other = PluginBeamSearch([model], d, beam_size=3, max_len_b=8)
        assert_same_hypotheses(hypotheses_of(decode_as_fairseq_generate(other, second)), alone)
        assert "_pool" in pooled.__dict__ and "_pool" not in other.__dict__
    finally:
        resume.set()
        thread.join(120)
        pooled.close_workers()


# --- through fairseq's tools ----------------------------------------------------


def test_generate_interactive_and_the_hub_with_two_workers(trained_checkpoints, reorder_data, caplog):
    soft = trained_checkpoints["soft"]
    runs = {}
    for count in (1, 2):
        overrides = f"{{{ENGINE}, 'decoding_workers': {count}}}"
        runs[count] = generate(reorder_data, soft, "--batch-size", 4, "--model-overrides", overrides)
    assert_same_output(runs[2].stdout, runs[1].stdout)
    assert len(re.findall(r"^H-", runs[2].stdout, re.M)) == 20
    assert "in 2 worker processes of one thread each (--decoding-workers 2)" in runs[2].stderr
    assert "worker processes" not in runs[1].stderr

    lines = [" ".join(f"s{(i * 7 + j) % 9 + 1}" for j in range(3 + i % 4)) for i in range(12)]
    found = {}
    for count in (1, 2):
        proc = interactive(reorder_data, soft, lines, "--buffer-size", 12, "--batch-size", 3,
                           "--model-overrides", f"{{{ENGINE}, 'decoding_workers': {count}}}")
        assert proc.returncode == 0, proc.stderr[-2000:]
        found[count] = proc.stdout
        assert ("worker processes" in proc.stderr) == (count == 2)
    assert_same_output(found[2], found[1])
    assert len(re.findall(r"^H-", found[1], re.M)) == 12

    # the plugin's hub: it reads fairseq's transformer as the plugin's (fairseq's hub keeps fairseq's model)
    translations = {}
    for count in (1, 2):
        hub = fairseq_hardattn.from_pretrained(str(soft.parent), checkpoint_file=soft.name,
                                               data_name_or_path=str(reorder_data), user_dir=USER_DIR,
                                               decoding_workers=count, batch_size=3)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="fairseq_hardattn.decoding.workers"):
            translations[count] = hub.translate(lines, beam=3)
        assert any("in 2 worker processes" in r.getMessage() for r in caplog.records) == (count == 2)
        # the call's workers stay for the next call with the same options; a call with
        # others starts its own, the first's ended: one pool at a time
        workers_of_the_first_call = set(multiprocessing.active_children())
        assert len(workers_of_the_first_call) == (2 if count == 2 else 0)
        assert hub.translate(lines, beam=3) == translations[count]
        assert set(multiprocessing.active_children()) == workers_of_the_first_call
        assert hub.translate(lines, beam=2)
        now = set(multiprocessing.active_children())
        assert len(now) == len(workers_of_the_first_call) and not now & workers_of_the_first_call
        workers.end_pools_left_behind()
        assert gc.get_freeze_count() == 0 and not multiprocessing.active_children()
    assert translations[2] == translations[1]


def test_the_hubs_workers_decode_the_weights_as_they_are_at_each_call(trained_checkpoints, reorder_data):
    """The hub keeps a generator, and its workers, from one call to the
    next: weights changed in place between calls are decoded as they are
    then (new workers), as by one process."""
    soft = trained_checkpoints["soft"]
    lines = [" ".join(f"s{(i * 5 + j) % 9 + 1}" for j in range(2 + i % 5)) for i in range(12)]

    def hub(workers):
        return fairseq_hardattn.from_pretrained(str(soft.parent), checkpoint_file=soft.name,
                                                data_name_or_path=str(reorder_data), user_dir=USER_DIR,
                                                decoding_workers=workers, batch_size=3)

    parallel, serial = hub(2), hub(1)
    assert parallel.translate(lines, beam=3) == serial.translate(lines, beam=3)
    workers_before = set(multiprocessing.active_children())
    assert len(workers_before) == 2
    with torch.no_grad():
        for one in (parallel, serial):
            for parameter in one.models[0].decoder.parameters():
                parameter.mul_(-1.0)
    changed = parallel.translate(lines, beam=3)
    assert changed == serial.translate(lines, beam=3)
    assert not set(multiprocessing.active_children()) & workers_before
    workers.end_pools_left_behind()


@pytest.mark.parametrize("overrides, fairseq_encodes", [({}, False), ({"int8_decoding": True}, True)])
def test_a_models_first_batch_imports_nothing_once_it_is_loaded(trained_checkpoints, reorder_data, overrides,
                                                                 fairseq_encodes):
    # what the first batch imported (fairseq's encoder: torch's symbolic shapes and SymPy,
    # half a second) comes with the model instead, before any worker forks: each worker
    # imported it again; where the native search encodes (the float32 model), nothing does
    soft = trained_checkpoints["soft"]
    script = f"""
import sys
import torch
from fairseq import checkpoint_utils, options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
args = options.parse_args_and_arch(options.get_generation_parser(), [
    {str(reorder_data)!r}, "--user-dir", {USER_DIR!r}, "--path", {str(soft)!r}, "--beam", "2",
    "--gen-subset", "test"])
cfg = convert_namespace_to_omegaconf(args)
task = tasks.setup_task(cfg.task)
task.load_dataset("test")
from fairseq_hardattn import compat
with compat.loading():  # as fairseq-generate with the plugin: a fairseq transformer decodes as the plugin's
    models, _ = checkpoint_utils.load_model_ensemble(
        [{str(soft)!r}], arg_overrides={{"decoding_engine": "auto", "decoding_workers": 1, **{overrides!r}}}, task=task)
for model in models:  # as fairseq-generate
    model.prepare_for_inference_(cfg)
generator = task.build_generator(models, cfg.generation)
# the whole test set: sentences of several lengths, so padding, which torch checks
batches = task.get_batch_iterator(task.dataset("test"), max_sentences=20).next_epoch_itr(shuffle=False)
batch = next(iter(batches))
loaded = set(sys.modules)
assert task.inference_step(generator, models, batch)
print(type(generator).__name__, sorted(m for m in set(sys.modules) - loaded),
      "torch.fx.experimental.symbolic_shapes" in loaded)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == f"PluginBeamSearch [] {fairseq_encodes}"


def test_the_hubs_first_call_imports_nothing_once_it_is_loaded(trained_checkpoints, reorder_data):
    # fairseq's batching module came with the hub's first call, and its Cython
    # set-up, which catches every exception, lost a Ctrl-C that came meanwhile
    hard = trained_checkpoints["hard"]
    script = f"""
import sys
from fairseq.models.transformer import TransformerModel
hub = TransformerModel.from_pretrained({str(hard.parent)!r}, checkpoint_file={hard.name!r},
                                       data_name_or_path={str(reorder_data)!r}, user_dir={USER_DIR!r},
                                       decoding_workers=1)
loaded = set(sys.modules)
assert hub.translate(["s1 s2 s3", "s4 s5"], beam=2)
print(sorted(m for m in set(sys.modules) - loaded))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_a_ctrl_c_while_signals_are_held_is_raised_after_even_where_every_exception_is_caught():
    script = """
import signal
from fairseq_hardattn.decoding.workers import signals_held
signal.signal(signal.SIGINT, signal.default_int_handler)  # as a program started from a terminal
try:
    with signals_held():
        try:
            signal.raise_signal(signal.SIGINT)
            sum(range(1000))  # where the handler would run
        except BaseException:  # as Cython's module set-up
            print("caught inside")
    print("never raised")
except KeyboardInterrupt:
    print("raised after")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["raised", "after"]


def test_bad_decoding_workers_is_one_line(trained_checkpoints, reorder_data):
    proc = generate(reorder_data, trained_checkpoints["hard"], "--model-overrides",
                    "{'decoding_workers': 0}", check=False)
    one_error_line(proc, "--decoding-workers must be 'auto' or a number >= 1, got 0")


def test_training_never_starts_workers(reorder_data, tmp_path):
    """--eval-bleu decodes the validation set with weights that change
    between validations: no worker may hold an old copy."""
    proc = train(reorder_data, tmp_path / "run", "transformer_soft", "--decoding-workers", "2",
                 "--eval-bleu", "--eval-bleu-args", '{"beam": 2, "max_len_b": 6}', "--batch-size", "4",
                 "--max-tokens", "200", updates=4)
    assert "worker processes" not in proc.stdout + proc.stderr


def test_a_large_batch_decodes_in_chunks_with_fairseqs_hypotheses_here_and_in_the_workers(monkeypatch):
    """A batch of more sentences than CHUNK_SENTENCES: fairseq's generator's
    hypotheses in order, decoded chunk after chunk in this process and each
    chunk a task of the workers, the same hypotheses both ways."""
    from fairseq.sequence_generator import SequenceGenerator

    monkeypatch.setattr(workers, "CHUNK_SENTENCES", 2)
    model, d = prepared_model("transformer_hard_dec_small", decoding_workers=1)
    samples = batches_of(d, count=3, size=5)
    with torch.no_grad():
        fairseqs = [SequenceGenerator([model], d, beam_size=3, max_len_b=8).generate([model], s) for s in samples]
    here = decode_as_fairseq_generate(PluginBeamSearch([model], d, beam_size=3, max_len_b=8), samples)
    for ours, theirs in zip(here, fairseqs):
        assert_same_hypotheses(ours, theirs)
    model.decoding_workers = 2
    generator = PluginBeamSearch([model], d, beam_size=3, max_len_b=8)
    submitted = []
    monkeypatch.setattr(workers.WorkerPool, "submit",
                        lambda pool, sample, _submit=workers.WorkerPool.submit:
                        submitted.append(read_ahead.source_tokens(sample).size(0)) or _submit(pool, sample))
    together = decode_as_fairseq_generate(generator, samples)
    assert submitted == [2, 2, 1] * 3  # each batch of 5 in three chunks
    assert_same_batches(together, here)
    generator.close_workers()


def test_a_batch_with_a_prefix_decodes_whole(monkeypatch):
    """A prefix (or constraints) belongs to its batch: no chunks."""
    monkeypatch.setattr(workers, "CHUNK_SENTENCES", 2)
    model, d = prepared_model(decoding_workers=1)
    sample = batches_of(d, count=1, size=5)[0]
    calls = []
    generator = PluginBeamSearch([model], d, beam_size=2, max_len_b=6)
    monkeypatch.setattr(PluginBeamSearch, "serial_generate",
                        lambda self, models, s, _serial=PluginBeamSearch.serial_generate, **kw:
                        calls.append(read_ahead.source_tokens(s).size(0)) or _serial(self, models, s, **kw))
    with torch.no_grad():
        generator.generate([model], sample, prefix_tokens=torch.full((5, 1), 5))
        generator.generate([model], sample)
    assert calls == [5, 2, 2, 1]


def test_the_rows_of_a_sample_keep_its_width():
    _, d = prepared_model()
    sample = batches_of(d, count=1, size=4)[0]
    sample["nsentences"] = 4
    part = workers.rows_of(sample, torch.tensor([1, 3]))
    assert part["id"].tolist() == [1, 3] and part["nsentences"] == 2
    assert torch.equal(part["net_input"]["src_tokens"], sample["net_input"]["src_tokens"][[1, 3]])
