"""Batches decoded in parallel on a CPU (``--decoding-workers``, a model
option: at decoding time ``--model-overrides "{'decoding_workers': 2}"`` or
the hub's ``decoding_workers=2``; ``auto``, the default, uses every thread
the process may use).

A step of the plugin's search at small dims is too small to split well over
cores, and Python threads share one interpreter lock. So, as CTranslate2's
``inter_threads``, the search decodes several batches at once: each in a
worker process of one thread, forked from the decoding process once the
model is ready, so that the weights (the int8 ones and oneDNN's packed
copies included) are shared with it, never copied. The process that asked
waits for the batch it asked for; the others are already under way, and a
worker done with its batches meanwhile is given the next ones.

The search finds the next batches through ``read_ahead``. A call whose batch
came from such a source, with no prefix or constraints, decodes in
parallel; any other call decodes as before. Outputs are one process's, in
the same order (the equality contract: docs/decoding_engine.md). A batch of
hundreds of sentences decodes in chunks (``CHUNK_SENTENCES``), in one
process one after another, with workers each chunk a task: the same chunks
either way. While batches are out in the workers, the objects alive at the
fork are frozen out of Python's cyclic collector
(``WorkerPool.hold_collector``), and the model's first batch imports nothing
(``import_what_the_first_batch_imports``): either would cost every worker a
few tenths of a second again.

Workers run only for models that fairseq's tools prepared for decoding
(``prepare_for_inference_``: fairseq-generate, fairseq-interactive, the
hub), whose weights no longer change; never in training (``--eval-bleu``),
where each validation must see the updated weights. They stay while their
generator may decode again: until another generator starts its workers
while they idle (the hub builds a generator per call: one call's workers
end as the next call starts its own) or the process ends, and never longer
than the process that forked them (``die_with_parent``). A process whose
other threads are decoding (a threaded server) forks no workers: a
fork copies only the thread that forks, and the locks the others hold would
stay locked in a worker; such a call decodes in its own thread. A worker
that fails hands its error to the caller; one that dies is replaced by the
calling process decoding its batches itself, with one warning.

Why not ``concurrent.futures.ProcessPoolExecutor``: its queues pickle with
multiprocessing's pickler (each tensor through a shared-memory file and a
socket: ``send`` says why not), one dead worker breaks the whole pool where
here the calling process takes over, and a running task cannot be stopped
where a command that is told to end kills its workers at once.
"""

import atexit
import collections
import contextlib
import copyreg
import gc
import importlib
import io
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import weakref
from typing import Dict, List, Optional

import torch

from ..compat.command_line import die_with_parent
from ..models.decoding_options import AUTO
from .packed_linear import packed_linears
from .read_ahead import batches_after, source_tokens, with_ids

logger = logging.getLogger(__name__)

# batches queued per worker: one decoding, one waiting, so that a worker
# never idles while the calling process prints the last batch
QUEUED_PER_WORKER = 2
# batches read ahead per worker, queued or done: a worker may run this far
# ahead of one whose batch is slow (results wait here, in order)
AHEAD_PER_WORKER = 2 * QUEUED_PER_WORKER
# a larger batch decodes in chunks of about this many sentences, one after
# another or in the workers at once: fairseq-generate's default --max-tokens
# makes batches of hundreds, whose step outgrows the CPU's caches
CHUNK_SENTENCES = 128
# workers start only for a source of more than one batch, and of at least
# this many chunks a worker (this call's and those read ahead): forking them
# and their first chunks cost about what that many chunks gain, so a call of
# a few (the hub's of a few sentences) decodes sooner in this process, on
# all its threads
TASKS_A_WORKER_TO_START = 2


def available_threads() -> int:
    """The threads this process may decode with: torch's intra-op threads
    (OMP_NUM_THREADS, torch.set_num_threads, else the cores it may use)."""
    return torch.get_num_threads()


def resolved_workers(setting) -> int:
    """Worker processes for ``setting`` (``auto``: one per thread the
    process may use; 1: none, the calling process decodes)."""
    if setting in (None, AUTO):
        return available_threads()
    return int(setting)


# imported with the model (``import_what_the_first_batch_imports``): every first batch's,
FIRST_BATCH_IMPORTS = ("torch.profiler._cupti_monitor", "fairseq.data.data_utils_fast")
# and fairseq's encoder's first forward's (the native search encodes without it)
FAIRSEQ_ENCODER_IMPORTS = ("torch.fx.experimental.symbolic_shapes",)


def import_what_the_first_batch_imports(fairseq_encodes: bool = True):
    """What a model's first batch would import, imported when the model is
    prepared for decoding instead, so that the first batch does not wait for
    it and workers forked later share it (each imported it again): the
    profiler's module that ``record_function`` imports on its first use,
    fairseq's batching module (the hub's first call), whose Cython set-up
    catches every exception: a Ctrl-C there was lost, so these are imported
    with signals held; and where fairseq's encoder is to encode
    (``fairseq_encodes``), torch's symbolic-shapes module and SymPy (its key
    padding mask check, ``torch._check_with``: half a second)."""
    with signals_held():
        for name in FIRST_BATCH_IMPORTS + (FAIRSEQ_ENCODER_IMPORTS if fairseq_encodes else ()):
            try:
                importlib.import_module(name)
            except ImportError:  # another PyTorch, or fairseq's own error where it is used
                pass


def can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


# --- a batch in chunks ----------------------------------------------------------

def rows_of(sample, selected: torch.Tensor):
    """The part of ``sample`` that holds its sentences ``selected`` (row
    indices), the padded width kept."""
    sentences = source_tokens(sample).size(0)

    def part(value):
        if isinstance(value, dict):
            return {key: part(item) for key, item in value.items()}
        if torch.is_tensor(value) and value.dim() > 0 and value.size(0) == sentences:
            return value[selected]
        return value

    chunk = part(sample)
    if "nsentences" in chunk:
        chunk["nsentences"] = len(selected)
    return chunk


def chunks_of(sample) -> List[Dict]:
    """``sample`` in chunks of at most ``CHUNK_SENTENCES`` sentences, as even
    as they divide (a CPU batch; any other whole)."""
    count = chunk_count(sample)
    if count == 1:
        return [sample]
    rows = torch.arange(source_tokens(sample).size(0))
    return [rows_of(sample, chunk) for chunk in rows.tensor_split(count)]


def chunk_count(sample) -> int:
    tokens = source_tokens(sample)
    if not torch.is_tensor(tokens) or tokens.device.type != "cpu" or tokens.size(0) <= CHUNK_SENTENCES:
        return 1
    return -(-tokens.size(0) // CHUNK_SENTENCES)


def plain(kwargs) -> bool:
    """A call without a prefix or constraints: its batch may decode in chunks,
    and in the workers (those belong to their batch: decoded whole, here)."""
    return not any(value is not None for value in kwargs.values())


# --- the workers ----------------------------------------------------------------


class WorkerDied(RuntimeError):
    pass


# what a worker forked now inherits (set only while forking: a process's
# arguments would keep the generator alive through its pool): the generator it
# serves, this process's id, whether the main thread forks, and the other
# workers' pipes (closed in the worker: a worker holding another's pipe would
# keep that one waiting after this process is gone)
_forking = None

def _tensor_by_value(tensor):
    """A CPU tensor pickled as the numbers it holds (a view: its own elements
    only), through numpy where it can."""
    if tensor.device.type == "cpu" and not tensor.requires_grad:
        try:
            return torch.from_numpy, (tensor.numpy(),)
        except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16)
            pass
    return tensor.__reduce_ex__(pickle.HIGHEST_PROTOCOL)


_BY_VALUE = copyreg.dispatch_table.copy()
_BY_VALUE[torch.Tensor] = _tensor_by_value


def send(connection, message):
    """Send ``message`` down a worker's pipe, its tensors by value. The
    pipe's own pickler (torch's reductions) would move each tensor to shared
    memory and hand its file over a socket served by a thread of the sender:
    a connection per tensor, and a sender killed mid-way left the other
    side's thread printing a ConnectionResetError."""
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = _BY_VALUE
    pickler.dump(message)
    connection.send_bytes(buffer.getbuffer())


def receive(connection):
    """What ``send`` sent down ``connection``."""
    return pickle.loads(connection.recv_bytes())


def _detach_from_the_terminal_streams():
    """stdin and stdout to /dev/null: a worker reads nothing and prints
    nothing there, and holding them would keep a pipeline's upstream writer
    (or downstream reader) waiting on it."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(null, fd)
    os.close(null)


def _serve(connection):
    """A worker's loop: decode each batch it is sent, send back the hypotheses."""
    global _searching, _searching_lock
    generator, parent_pid, by_the_main_thread, others = _forking
    die_with_parent(parent_pid, by_the_main_thread)
    for other in others:
        other.close()
    _detach_from_the_terminal_streams()
    # the calling process handles Ctrl-C (and stops the workers); a signal meant
    # to end the command ends a worker at once (not the parent's handlers), one
    # the command ignores (nohup's SIGHUP) the worker ignores too
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for number in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if number is not None and signal.getsignal(number) is not signal.SIG_IGN:
            signal.signal(number, signal.SIG_DFL)
    # the forking thread held this lock: a fresh one (no search runs here but this loop's)
    _searching, _searching_lock = 0, threading.Lock()
    torch.set_num_threads(1)  # more than one would hang: GNU OpenMP's pool does not survive a fork
    while True:
        try:
            task = receive(connection)
        except (EOFError, OSError):
            break
        if task is None:
            break
        number, sample = task
        try:
            with torch.no_grad():
                reply = (number, generator.generate_here(sample), None)
        except BaseException as error:  # handed to the caller
            reply = (number, None, error)
        if not _hand_back(connection, reply):  # the caller is gone: nothing to do
            os._exit(0)
    connection.close()


def _hand_back(connection, reply) -> bool:
    """Send a worker's ``reply``; False when the caller is gone."""
    try:
        try:
            send(connection, reply)
        except (OSError, EOFError):
            raise
        except Exception:  # an error that does not pickle (pickling precedes any write)
            number, _, error = reply
            send(connection, (number, None, RuntimeError(f"{type(error).__name__}: {error}")))
        return True
    except (OSError, EOFError):
        return False


@contextlib.contextmanager
def signals_held():
    """Signals with a Python handler (Ctrl-C's KeyboardInterrupt) that arrive
    inside are handled after it: Python would run the handler wherever the
    main thread is, in a fork hook (logging's, multiprocessing's) or in code
    that catches every exception (Cython's module set-up), and the exception
    it raises there would be ignored, Ctrl-C lost."""
    held = {}
    if threading.current_thread() is threading.main_thread():  # only it may set handlers
        for name in ("SIGINT", "SIGTERM", "SIGHUP"):
            number = getattr(signal, name, None)
            handler = number and signal.getsignal(number)
            if callable(handler):
                held[number] = handler
    arrived = []
    for number in held:
        signal.signal(number, lambda number, frame: arrived.append(number))
    try:
        yield
    finally:
        for number, handler in held.items():
            signal.signal(number, handler)
        for number in arrived:
            signal.raise_signal(number)


class WorkerPool:
    """``workers`` processes forked from this one, each decoding the batches
    it is sent with ``generator`` (as it was at the fork), in order."""

    def __init__(self, generator, workers: int):
        global _forking
        context = multiprocessing.get_context("fork")
        # oneDNN's packed weights made here, before the fork, are the workers' too
        self.packing = contextlib.ExitStack()
        for model in generator.model.models:
            self.packing.enter_context(packed_linears(model))
        # what sits in this process's stdio buffers would be written again by a worker
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        self.connections, self.processes = [], []
        # the objects alive now (the model, fairseq's modules, the data) out of
        # the cyclic collector's reach (``hold_collector``); the workers keep them so
        self.lock, self.holding = threading.Lock(), False
        self.hold_collector()
        main_thread = threading.current_thread() is threading.main_thread()
        try:
            with signals_held():
                for _ in range(workers):
                    ours, theirs = context.Pipe()
                    _forking = (generator, os.getpid(), main_thread, list(self.connections))
                    process = context.Process(target=_serve, args=(theirs,), daemon=True)
                    process.start()
                    theirs.close()
                    self.connections.append(ours)
                    self.processes.append(process)
        except BaseException:
            self.kill()
            raise
        finally:
            _forking = None
        self.queued = [collections.deque() for _ in range(workers)]  # task numbers per worker
        self.results = {}
        self.next_number = 0
        self.generator = weakref.ref(generator)  # (no callback: ``_pools`` says why)
        _pools.add(self)
        # (again: the last registered, so that it runs before multiprocessing's
        # own exit function, which would wait for the workers)
        atexit.unregister(_kill_pools_at_exit)
        atexit.register(_kill_pools_at_exit)

    def submit(self, sample) -> int:
        """Queue ``sample`` on the least busy worker; returns its task number."""
        with self.lock:
            worker = min(range(len(self.queued)), key=lambda w: len(self.queued[w]))
            number, self.next_number = self.next_number, self.next_number + 1
            try:
                send(self.connections[worker], (number, sample))
            except OSError as error:
                raise WorkerDied(self._exited(worker)) from error
            self.queued[worker].append(number)
            return number

    def hold_collector(self):
        """While batches are out in the workers, keep the objects alive now
        out of the cyclic collector's reach (``gc.freeze``, unless the process
        froze objects itself). Its full passes scan every object: 0.17-0.3 s
        each at the small preset, on a core the workers need, once in every
        worker (whose pass would also write every object's header, copying
        the pages it shares with this process) and here while they decode."""
        with self.lock:
            if not self.holding and gc.get_freeze_count() == 0:
                gc.freeze()
                self.holding = True

    def release_collector(self):
        """The objects are the collector's again: no batch is out (frozen, a
        cycle among them, an exception's say, would keep them all, this
        generator and its workers included)."""
        with self.lock:
            if self.holding:
                self.holding = False
                gc.unfreeze()

    def in_flight(self) -> int:
        return sum(len(q) for q in self.queued)

    def result(self, number: int, while_waiting=None):
        """The hypotheses of task ``number`` (waits for them); raises the
        worker's error, or ``WorkerDied``. Other tasks' results that arrive
        meanwhile are kept, and ``while_waiting`` is called after each: a
        worker done before the one that decodes ``number`` gets more work
        instead of idling (its tasks may take less time)."""
        while True:
            with self.lock:
                if number in self.results:
                    result, error = self.results.pop(number)
                    break
                busy = [self.connections[w] for w, q in enumerate(self.queued) if q]
                assert busy, f"task {number} was never submitted"
                for connection in multiprocessing.connection.wait(busy):
                    worker = self.connections.index(connection)
                    try:
                        done, result, error = receive(connection)
                    except (EOFError, OSError) as error:
                        raise WorkerDied(self._exited(worker)) from error
                    self.queued[worker].remove(done)
                    self.results[done] = (result, error)
            if while_waiting is not None and number not in self.results:
                while_waiting()
        if error is not None:
            raise error
        return result

    def _exited(self, worker):
        process = self.processes[worker]
        process.join(timeout=1)
        return f"decoding worker {process.pid} exited (code {process.exitcode})"

    def close(self):
        """End the workers: idle ones when told to (they finish at once), busy
        ones killed (what they decode is no longer wanted)."""
        if self.in_flight():
            self.kill()
            return
        for connection in self.connections:
            try:
                send(connection, None)
                connection.close()
            except OSError:
                pass
        for process in self.processes:
            process.join(timeout=1)
        self.kill()

    def kill(self, wait=True):
        """End the workers now (SIGKILL: a worker writes nothing a kill
        could leave half done) and give back what the pool holds. Without
        ``wait`` nothing here blocks: multiprocessing reaps the workers at its
        next start or at exit."""
        for process in self.processes:
            if process.is_alive():
                process.kill()
        for process in self.processes if wait else ():
            process.join(timeout=1)
        for connection in self.connections:
            connection.close()
        for queued in getattr(self, "queued", ()):
            queued.clear()
        self.packing.close()
        self.release_collector()
        _pools.discard(self)


# calls decoding in this process's threads, here or through their workers: a
# fork copies only the thread that forks, so none starts while another thread
# decodes (a lock that thread's PyTorch ops hold would stay locked in the workers)
_searching = 0
_searching_lock = threading.Lock()


# every pool of this process that has not ended. A generator dropped with
# its pool (the hub builds one per call, and fairseq's configuration objects
# keep each in a reference cycle until a full collection) leaves its workers
# to the next pool's start or the process's end: a finalizer would run
# wherever the collector frees the generator, and a Ctrl-C arriving while it
# runs would raise there, only reported, never reaching the program
_pools = set()


def end_pools_left_behind():
    """End the pools no call will use: those of generators that are gone,
    and the idle ones of other generators (a later call of theirs starts
    another). Called by the one call that decodes, as it starts a pool; the
    pools' objects are freed here too, signals held."""
    with signals_held():
        left = list(_pools)
        while left:  # (no name keeps a pool past the block)
            _end_if_left_behind(left.pop())


def _end_if_left_behind(pool):
    generator = pool.generator()
    if generator is None:
        pool.close()
    elif (generator.__dict__.get("_pool") is pool and not pool.in_flight()
          and not generator.__dict__.get("_pending")):
        generator.close_workers(workers_later=True)


def _kill_pools_at_exit():
    for pool in list(_pools):
        pool.kill(wait=False)


@contextlib.contextmanager
def searching():
    """Counts the calling thread's decoding call while it runs."""
    global _searching
    with _searching_lock:
        _searching += 1
    try:
        yield
    finally:
        with _searching_lock:
            _searching -= 1


class ParallelBatches:
    """A mixin of the plugin's generators: ``generate`` decodes the batches
    ahead of this one in worker processes where it can (``--decoding-workers``);
    ``generate_here`` decodes one batch in this process."""

    def generate_here(self, sample, **kwargs):
        with searching():
            sample = with_ids(sample)  # (a chunk's sentences keep theirs)
            chunks = chunks_of(sample) if plain(kwargs) else [sample]
            return [hypotheses for chunk in chunks
                    for hypotheses in self.serial_generate(self.model.models, chunk, **kwargs)]

    def generate(self, models, sample, **kwargs):
        # counted from before the pool is chosen: another thread starting a pool
        # then ends no pool this call is about to use (``end_pools_left_behind``)
        with searching():
            pending = self.__dict__.setdefault("_pending", {})  # id(src_tokens) -> (src_tokens, tasks)
            tokens = source_tokens(sample)
            # batches read ahead are decoded without a prefix or constraints: so must this one be
            plain_call = plain(kwargs)
            entry = pending.pop(id(tokens), None) if plain_call and torch.is_tensor(tokens) else None
            if entry is not None and entry[0] is not tokens:
                entry = None
            pool = self._pool_for(sample, plain_call) if entry is None else self._pool
            if pool is None:
                return self.generate_here(sample, **kwargs)
            return self._generate_through(pool, sample, entry, pending, kwargs)

    def _generate_through(self, pool, sample, entry, pending, kwargs):
        pool.hold_collector()
        try:
            # each chunk a task of its own: the workers share a large batch out
            numbers = ([pool.submit(chunk) for chunk in chunks_of(with_ids(sample))] if entry is None
                       else entry[1])
            window = len(pool.processes) * QUEUED_PER_WORKER

            def keep_workers_busy():  # the batches after this one, up to the window
                for ahead in batches_after(sample, len(pool.processes) * AHEAD_PER_WORKER):
                    if pool.in_flight() >= window:
                        break
                    ahead_tokens = source_tokens(ahead)
                    if id(ahead_tokens) not in pending:
                        pending[id(ahead_tokens)] = (ahead_tokens,
                                                     [pool.submit(chunk) for chunk in chunks_of(ahead)])

            found = []
            for number in numbers:
                keep_workers_busy()
                found += pool.result(number, while_waiting=keep_workers_busy)
            keep_workers_busy()  # (while the caller prints this batch)
            return found
        except WorkerDied as error:
            logger.warning("fairseq-hardattn: %s; decoding the remaining batches in this process",
                           error)
            self.close_workers()
            return self.generate_here(sample, **kwargs)
        except BaseException:  # an interrupt, a worker's error: the batches out are not wanted
            self.close_workers(workers_later=True)
            raise
        finally:
            if not pool.in_flight() and not pending:  # the last batch of the source, or of its read-ahead
                pool.release_collector()

    def _pool_for(self, sample, plain_call) -> Optional[WorkerPool]:
        """The worker pool for this call, started on the first call that can
        use one; None: decode here."""
        pool = self.__dict__.get("_pool")
        if pool is not None or not plain_call or getattr(self, "_workers_off", False):
            return pool
        models = self.model.models
        src_tokens = source_tokens(sample)
        setting = getattr(models[0], "decoding_workers", 1)
        if (not torch.is_tensor(src_tokens) or src_tokens.device.type != "cpu"
                or not all(getattr(m, "prepared_for_inference", False) for m in models)):
            return None
        workers = resolved_workers(setting)
        if workers < 2 or not can_fork():
            self._workers_off = True
            return None
        # one batch, or a few chunks: here, with all the threads
        ahead = batches_after(sample, TASKS_A_WORKER_TO_START * workers - 1)
        if not ahead or sum(map(chunk_count, [sample, *ahead])) < TASKS_A_WORKER_TO_START * workers:
            return None
        with _searching_lock:  # no search starts while this thread forks
            if _searching > 1:  # another call decodes (a threaded server): this one decodes here
                return None
            end_pools_left_behind()
            self._pool = WorkerPool(self, workers)
        logger.info("decoding %d batches at a time, in %d worker processes of one thread each "
                    "(--decoding-workers %s%s), the model's weights shared", workers, workers,
                    setting, f": the {workers} threads this process may use" if setting == AUTO else "")
        return self._pool

    def close_workers(self, workers_later=False):
        """End this generator's workers; a later call may start others only
        when ``workers_later`` (after an interrupt; not after a worker died)."""
        pool = self.__dict__.pop("_pool", None)
        self._pending = {}
        self._workers_off = not workers_later
        if pool is not None:
            pool.close()
