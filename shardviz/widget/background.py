"""The Inspector's slow work, off the kernel's thread: one job at a time, cancellable.

An edit sends its numbers first; what takes longer (measuring the activations of a new dtype,
sequence length or plan, the findings with SV201's what-ifs, the Suggest search) runs on a worker
thread, so that the kernel keeps reading the front end's messages. A new edit, or the "cancel"
button, cancels the job running: the worker thread is asked to stop (``activations.stop``) and
raises ``Cancelled`` (a ``BaseException``, which no ``except Exception`` in the analysis swallows)
itself at its next check: the next operation its measurement dispatches in forward, the next module
hook in backward, between the job's stages, between Suggest's candidates. The next job starts only
once it has ended, so that two measurements never run at once (they patch module-level functions
while they run).

Once an edit's first findings are sent, the worker goes on with the look-ahead (``look_ahead``): it
measures what the likely next edits need (the LoRA presets, one block checkpointed, one block's
LoRA, TP 2's local copy of the model, every block, one block's checkpoint then its LoRA, the other
parameter dtype, half the sequence, TP 2, then Suggest's whole search)
into the measurement caches, so that the edit itself finds its step measured and Suggest its rows.
The look-ahead is invisible: once the findings are priced, the widget is idle (``Worker.busy`` is
False, ``wait()`` returns), and the next edit cancels it like any job, unless the look-ahead is
measuring that edit's very step: that measurement goes on to its end (``BackgroundPush.stop``).
A step the user's own code needs meanwhile (``sv.analyze`` in the next cell) stops the look-ahead's
measurement rather than run beside it (``measure_cache.one_step``: one step at a time per process).
One Inspector looks ahead, the one used last: another's job stops it (``Worker.stop_others_looking_ahead``).
An edit that comes while the look-ahead is half way through a step sets it aside rather than throw it
away (``Worker.cancel(keep_ahead=True)``, ``measure_cache.set_aside``): the step waits while the edit's
numbers go out, goes on once something waits for it, and is kept for the next edits.

On Linux, SV201's what-ifs are priced meanwhile in a forked copy of the kernel (``price_in_fork``;
elsewhere, on the worker before the look-ahead): measuring is Python that holds the GIL, so a
second thread would only take turns, while the copy has a core of its own (and its own module
functions to patch). The priced findings come back and are sent; the steps they measured are kept
here too. A new edit kills the copy.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import gc
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import collector, forked
from ..activations import measure_cache, stop
from ..analysis import analyze
from ..format import format_count
from . import panels
from .look_ahead import look_ahead
from .panels import host_ram_text

if TYPE_CHECKING:
    from .inspector import Inspector

#: What the worker says it does once the numbers are sent (the summary shows it, with a cancel button)
PRICING = "pricing the findings' what-ifs (SV201's fixes)"

#: How long an edit without a micro-batch waits for its numbers on the worker (they take ms).
NUMBERS_WAIT_S = 1.0

#: How long an edit waits for the look-ahead to finish measuring that very edit's step (a 70B step
#: takes about a second) before it stops the look-ahead and measures the step itself.
FINISH_AHEAD_S = 3.0


_FROZEN = False


def freeze_long_lived() -> None:
    """Once per process, when the first Inspector is made: collect, then move every object alive
    (torch, transformers, the user's model) out of the cyclic collector's walks (``gc.freeze``).

    A full collection walks every tracked object: with Llama-3.1-70B + LoRA on meta that is about
    620,000 of them (290,000 from the imports, 330,000 from the model), about 0.45 s per collection
    and about one collection per edit (CPU time, ``gc.callbacks``). They live as long as the
    kernel, so walking them finds nothing. Only the first Inspector freezes: a later one would
    also freeze an earlier Inspector still alive, whose cycles could then never be collected."""
    global _FROZEN
    if not _FROZEN:
        _FROZEN = True
        gc.collect()
        gc.freeze()


#: raised inside the worker thread, at its next check, once ``Worker.cancel`` asked it to stop
Cancelled = stop.Stopped


#: every Worker, so that a job still running when the interpreter exits is stopped first (a daemon
#: thread frozen inside torch at shutdown can abort the process)
_WORKERS: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _stop_workers() -> None:
    for worker in list(_WORKERS):
        worker.cancel()
        worker.stop_aside()


class Worker:
    """Runs ``fn`` on a daemon thread; ``on_error(exc)`` for an exception it raises."""

    def __init__(self, on_error: Callable[[BaseException], None]):
        _WORKERS.add(self)
        self._thread: threading.Thread | None = None
        self._on_error = on_error
        self.label = ""
        self.started = 0.0
        #: set when the job's visible work is done (``settle``) or it ended: what is left is the look-ahead
        self.settled = threading.Event()
        self.settled.set()
        self.job = 0  # counts the jobs started: ``settle(job)`` from another thread settles that job only
        #: the look-ahead's step being measured: its (plan, mesh, training) and an Event set once it is done
        self.ahead_step: tuple | None = None
        #: a job whose look-ahead an edit set aside in the middle of a step (``cancel(keep_ahead=True)``)
        self.aside: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        """A job runs whose results the widget still waits for (the look-ahead does not count)."""
        return self._thread is not None and self._thread.is_alive() and not self.settled.is_set()

    def settle(self, job: int | None = None) -> None:
        """Called by the job (or for ``job``, unless another has started since): what the widget
        waits for is sent; the rest is look-ahead."""
        if job is None or job == self.job:
            self.settled.set()

    def start(self, fn: Callable[[], None], label: str) -> None:
        self.cancel()
        self.stop_others_looking_ahead()
        self.label, self.started = label, time.time()
        self.job += 1
        self.settled = threading.Event()  # this job's own: one set aside settles its own
        self._thread = threading.Thread(target=self._main, args=(fn, self.settled), daemon=True,
                                        name=f"shardviz Inspector: {label}")
        self._thread.start()

    def stop_others_looking_ahead(self) -> None:
        """Stop the look-ahead of every other Inspector (their visible work goes on): it measures for the
        next edit of a widget the user has left (a re-run cell leaves the old one displayed and alive),
        about 20 s of a core after one edit at 70B, while this one's edit and look-ahead need the CPU."""
        for other in list(_WORKERS):
            if other is not self and not other.busy:
                other.cancel()
                other.stop_aside()

    def _main(self, fn, settled: threading.Event) -> None:
        try:
            with collector.quiet():  # its analyses' objects die young; full collections wait for it to end
                fn()
        except Cancelled:
            pass
        except Exception as exc:  # noqa: BLE001 - shown in the widget, never lost in a thread
            if not settled.is_set():  # an error of the look-ahead is no one's: the edit will say it
                self._on_error(exc)
        finally:
            settled.set()
            stop.forget(threading.get_ident())  # its ident may be a later thread's: no request left for it

    @contextlib.contextmanager
    def measuring_ahead(self, inputs: tuple):
        """Around the look-ahead's measurement of the step of ``inputs`` (plan, mesh, training)."""
        step = self.ahead_step = (inputs, threading.Event())
        try:
            yield
        finally:
            step[1].set()
            if self.ahead_step is step:  # not a later job's (this one may have been set aside)
                self.ahead_step = None

    def finishing_ahead(self, inputs: tuple) -> threading.Event | None:
        """The Event of the look-ahead's measurement when it measures the step of ``inputs``."""
        step = self.ahead_step
        t = self._thread
        if step is None or t is None or not t.is_alive() or step[0] != inputs:
            return None
        return step[1]

    def cancel(self, finish: threading.Event | None = None, keep_ahead: bool = False) -> bool:
        """Stop the running job and wait for it to end: True when its visible work was stopped,
        False when none ran or only the look-ahead (stopped too). With ``finish`` (from
        ``finishing_ahead``), the look-ahead first measures to the end the step the edit needs.
        With ``keep_ahead`` (an edit), a look-ahead in the middle of a step is set aside instead
        (``aside``, ``measure_cache.set_aside``): parked at its next operation, it measures on once a
        step or a fork waits for it (the next look-ahead, the findings' copy), keeps the step, which
        the next edits likely need too, and stops; a step the edit needs stops it. One at a time."""
        t = self._thread
        if t is None or t is threading.current_thread() or not t.is_alive():
            return False
        if finish is not None:
            finish.wait(FINISH_AHEAD_S)
        visible = not self.settled.is_set()
        if keep_ahead and not visible and not (self.aside is not None and self.aside.is_alive()) \
                and measure_cache.set_aside(t.ident):
            self.aside, self._thread = t, None
            return False
        _stop_thread(t)
        return visible

    def stop_aside(self) -> None:
        """Stop the job set aside, if one is left (torch's own step is about to run, the kernel ends)."""
        t, self.aside = self.aside, None
        if t is not None and t.is_alive() and t is not threading.current_thread():
            _stop_thread(t)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the running job's visible work; True once none is left (the look-ahead may run on)."""
        t = self._thread
        if t is not None and t is not threading.current_thread():
            self.settled.wait(timeout)
        return not self.busy


def _stop_thread(t: threading.Thread) -> None:
    """Ask ``t`` to stop and wait for it: it stops itself at its next check (``activations.stop``:
    never an exception injected into it)."""
    stop.request(t.ident)
    t.join(30)
    stop.forget(t.ident)


class BackgroundPush:
    """The Inspector's pushes after a change, the slow part on a ``Worker``: the widget holds one
    (``Inspector.pushes``) and this sets the widget's traits, one thread at a time (``lock``)."""

    def __init__(self, widget: Inspector):
        self.widget = widget
        self.worker = Worker(self.on_worker_error)
        self.lock = threading.RLock()  # one thread at a time sets the traits
        self.interim_revision: int | None = None  # the model-state numbers of this revision went first
        self.run_order = None  # the last analysis's module order (the model-state numbers reuse it)
        self.shown_memory: dict | None = None  # the memory chart's payload as sent (interim or full)
        self.host_ram_text = ""
        self.interrupted = False  # a change of view (pin, target release) stopped the background work
        #: measure the likely next edits once the findings are sent (``look_ahead``): on with a front
        #: end (the Inspector sets it), off for a widget no one sees
        self.ahead = False
        #: set by ``stop`` when the look-ahead measures the next state's very step (its Event): ``push_state`` waits for it
        self.finishing = None

    def push_state(self, initial: bool = False) -> None:
        """After a change of plan, mesh or training: charts first, then rows, then findings.

        With a front end (``background``), what is slow runs on the worker thread. With a
        micro-batch the main thread sends the model-state numbers first (milliseconds; marked
        pending), then the worker measures the step's activations (a new dtype, sequence length
        or plan needs a new measurement, about a second on 70B) and sends the full numbers; the
        findings (SV201's what-ifs), A vs B and the Suggest panel's state follow from the worker,
        so the next edit, which cancels it, never waits for them. When the look-ahead is measuring
        this very step (``stop`` left it running), the rows go first, then it ends (``wait_for_ahead``)."""
        w = self.widget
        st = w.controller
        finishing, self.finishing = self.finishing, None
        self.interrupted = False
        if initial or not w.background:
            self.worker.cancel(finishing)
            self.push_first(initial)
            return
        rev = st.revision
        if finishing is not None:
            t0 = time.perf_counter()
            self.wait_for_ahead(rev, finishing)
            interim = None  # the step is measured now: the full numbers at once
        else:
            self.worker.cancel(keep_ahead=True)
            t0 = time.perf_counter()
            interim = self.model_state_numbers()
        st.timings["model_state_s"] = time.perf_counter() - t0
        ready, go = threading.Event(), threading.Event()

        def job():
            while not go.wait(1):  # the model-state numbers go first, without the worker's competition
                pass
            for key in ("memory", "traffic", "timeline"):
                stop.check()  # between stages too: a new edit stops the job at the first of them it reaches
                getattr(st, key)
            with self.lock:
                ready.set()
                self.worker.label = PRICING
                if self.interim_revision == rev:  # the model-state numbers went first: the full ones now
                    self.push_numbers()
            self.push_first_findings(rev)
            stop.check()
            self.price_and_look_ahead(rev)

        self.worker.start(job, "measuring the activations" if interim else "checking the plan")
        try:
            if interim is None:  # no micro-batch: the numbers are quick
                go.set()
                ready.wait(NUMBERS_WAIT_S)
            with self.lock:
                if ready.is_set():
                    self.push_numbers()
                    self.push_rows_and_stale_code(rev)
                else:
                    self.push_interim(rev, interim)
                w.work = self.work_state()
        finally:
            go.set()
        st.timings["numbers_sent_s"] = time.perf_counter() - t0

    def wait_for_ahead(self, rev: int, finishing: threading.Event) -> None:
        """The look-ahead measures this revision's very step (``finishing``: set once it is measured):
        the rows show the edit at once, over the last numbers dimmed, then the step ends (the
        model-state numbers would wait for it: in Python 3.11 a ``cached_property`` holds one lock
        for every instance, which the look-ahead's ``Analysis.memory`` holds while it measures)."""
        w = self.widget
        with self.lock:
            if w.memory and not w.memory.get("pending"):
                w.memory = {**w.memory, "pending": "activations being measured"}
                self.shown_memory = w.memory
            with w.hold_sync():  # the header's plan facts and the controls follow the edit too
                w.summary = w.summary_payload()
                w.controls = w.controls_payload()
                w.work = {"busy": True, "label": "measuring the activations", "since": time.time(), "revision": rev}
            self.push_rows_and_stale_code(rev)
        self.worker.cancel(finishing)

    def push_interim(self, rev: int, interim: dict | None) -> None:
        """Before the full numbers, under ``lock``: the model-state numbers (``interim``; the last full
        ones stay on screen, dimmed, until the job sends the full ones), the rows and the stale code."""
        self.interim_revision = rev
        if interim is not None:
            self.push_numbers(interim)
        self.push_rows_and_stale_code(rev)

    def push_rows_and_stale_code(self, rev: int) -> None:
        """The rows that changed, and the code and the verification marked stale (under ``lock``)."""
        w = self.widget
        w.push_rows()
        w.verify_result = {}
        w.code = {"stale": True, "revision": rev}

    def push_first(self, initial: bool) -> None:
        """Everything at once (no front end), or the first numbers and the rest in the background."""
        w = self.widget
        st = w.controller
        rev = st.revision
        with self.lock:
            self.push_numbers()
            w.push_rows(reset=initial)
        if not w.background:
            self.push_rest(rev)
            return

        def rest():
            self.push_first_findings(rev)
            st.names.known()  # the presets an edit's name is measured from: built once, here
            self.price_and_look_ahead(rev)

        self.worker.start(rest, PRICING)
        w.work = self.work_state()

    def price_and_look_ahead(self, rev: int) -> None:
        """On the worker: the findings' what-ifs priced and sent (``push_rest``), then the look-ahead.
        With the look-ahead on Linux, the what-ifs are priced in a forked copy of the kernel
        (``price_in_fork``, seconds at 70B) while this thread looks ahead: two cores, not one,
        so that the next edit finds its step measured even when it comes as soon as the findings
        are in. If the copy fails, they are priced here."""
        st = self.widget.controller
        if not (self.ahead and forked.available()):
            self.push_rest(rev)
            self.worker.settle()
            if self.ahead:
                look_ahead(st, rev, measuring=self.worker.measuring_ahead)
            return
        pricer = self.price_in_fork(rev)
        try:
            look_ahead(st, rev, measuring=self.worker.measuring_ahead)
            while not pricer.done.wait(0.01):
                stop.check()
            if not pricer.ok:
                self.push_rest(rev)
                self.worker.settle()
        finally:
            pricer.kill()  # a new edit cancelled this job: the copy priced the state left behind

    def price_in_fork(self, rev: int) -> forked.Forked:
        """``st.analysis.findings`` computed in a forked copy; once back, set on the analysis (as if
        computed here), the steps its what-ifs measured kept in this process's cache
        (``measure_cache.adopt``), and sent (``push_rest``)."""
        st = self.widget.controller
        a, job, at = st.analysis, self.worker.job, measure_cache.mark()

        def priced():
            return a.findings, measure_cache.kept_since(at)

        def delivered(pricer: forked.Forked) -> None:
            if not pricer.ok:
                return
            findings, kept = pricer.result
            measure_cache.adopt(at, kept)
            with self.lock:
                if st.revision != rev or st.analysis is not a:
                    return
                a.__dict__.setdefault("findings", findings)  # the cached_property's own slot
            try:
                self.push_rest(rev)
            except Exception as exc:  # noqa: BLE001 - shown in the widget, never lost in a thread
                self.on_worker_error(exc)
            self.worker.settle(job)

        return forked.Forked(priced, delivered)

    def model_state_numbers(self) -> dict | None:
        """The charts' payloads without activations (parameters, gradients, optimizer states,
        communication buffers: what does not need a measured step), in milliseconds, with the
        run order of the last analysis; None without a micro-batch (the numbers are quick) or
        when no run order is known yet."""
        w = self.widget
        st = w.controller
        tr = st.training
        if not tr.with_activations or self.run_order is None:
            return None
        a = analyze(st.tree, st.plan, st.mesh, dataclasses.replace(tr, batch_size=None), strict=False,
                    torch_version=st.torch_version)
        a.__dict__["run_order"] = self.run_order  # the order does not depend on dtypes, shapes or checkpointing
        note = (f"activations at {format_count(tr.batch_size)} x {format_count(tr.seq_len)} tokens: being measured "
                "(the bars show the model state only)")
        return {"memory": {**panels.memory_payload(a), "pending": note}, "traffic": panels.traffic_payload(a),
                "host_ram": host_ram_text(a),
                "timeline": {"available": False, "reason": f"step time: {note}", "pending": True}}

    def push_numbers(self, interim: dict | None = None) -> None:
        """The charts, the summary and the controls: the full numbers, or ``interim``'s."""
        w = self.widget
        st = w.controller
        rev = st.revision
        numbers = interim or {key: getattr(st, key) for key in ("memory", "traffic", "timeline")}
        if interim is None:
            self.interim_revision = None
            self.run_order = st.analysis.__dict__.get("run_order", self.run_order)
        self.host_ram_text = interim["host_ram"] if interim else host_ram_text(st.analysis)
        self.shown_memory = numbers["memory"]
        with w.hold_sync():
            w.memory = {**numbers["memory"], "revision": rev}
            w.traffic = {**numbers["traffic"], "revision": rev}
            w.timeline = {**numbers["timeline"], "revision": rev}
            w.summary = w.summary_payload()
            w.controls = w.controls_payload()
            w.work = self.work_state()

    def push_first_findings(self, rev: int) -> None:
        """The findings without their what-ifs (``InspectorState.first_findings``, the checks' own time),
        those still being priced marked ``pending``, unless the state moved on or the full ones are in."""
        w = self.widget
        st = w.controller
        first = st.first_findings
        with self.lock:
            if st.revision != rev or st.computed("findings") is not None:
                return
            with w.hold_sync():
                w.findings = first
                w.summary = w.summary_payload()

    def push_rest(self, rev: int) -> None:
        """The findings, A vs B and the Suggest panel's state, once computed (on the worker, in the
        background), unless the state has changed since ``rev``."""
        w = self.widget
        st = w.controller
        findings = st.findings
        comparison = {**st.comparison, "revision": rev}
        suggestions = {**st.suggestions, "revision": rev}
        with self.lock:
            if st.revision != rev:
                return
            w.findings = findings
            with w.hold_sync():
                w.comparison = comparison
                w.suggestions = suggestions
                w.summary = w.summary_payload()
                w.verify_result = {}
                if w.tab == "export":
                    w.push_code()
                else:
                    w.code = {"stale": True, "revision": rev}
                w.work = self.work_state(done=True)
            w.push_messages()

    def work_state(self, done: bool = False) -> dict:
        """What the worker is doing (the summary shows it, with a cancel button), or nothing."""
        job, revision = self.worker, self.widget.controller.revision
        if done or not job.busy:
            return {"busy": False, "revision": revision}
        return {"busy": True, "label": job.label, "since": job.started, "revision": revision}

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the work after the last change (activations, findings, Suggest) is done and
        sent; True once nothing runs. Without a front end everything runs at once and this returns."""
        return self.worker.wait(timeout)

    def cancel(self) -> bool:
        """Stop the work running in the background (the summary's "cancel"); True if something ran."""
        w = self.widget
        label = self.worker.label
        if not self.worker.cancel():
            return False
        st = w.controller
        if st.suggest_status.get("state") == "running":
            st.suggest_status = {"state": "cancelled", "error": "the search was cancelled"}
            w.suggestions = {**st.suggestions, "revision": st.revision}
        st.say("info", f"cancelled: {label}; the numbers shown are those sent before", notify=False)
        with self.lock:
            w.work = self.work_state()
            w.push_messages()
        return True

    def stop(self, to=None) -> None:
        """Before the state changes (to the snapshot ``to``): cancel the running job (it was for the
        state left behind). When the look-ahead measures ``to``'s very step, that step goes on to its
        end first, rather than be measured again."""
        w = self.widget
        st = w.controller
        searching = st.suggest_status.get("state") == "running"
        finish = None if to is None or searching else self.worker.finishing_ahead((to.plan, to.mesh, to.training))
        if finish is not None:  # the step goes on: push_state sends the rows first, then waits for it
            self.finishing = finish
            return
        if self.worker.cancel(keep_ahead=True):
            self.interrupted = True
            if searching:
                st.suggest_status = {"state": "cancelled", "error": "the search was stopped by a change"}

    def on_worker_error(self, exc: BaseException) -> None:
        w = self.widget
        w.controller.say("error", f"{type(exc).__name__}: {exc}", notify=False)
        with self.lock:
            w.work = {"busy": False, "revision": w.controller.revision}
            w.push_messages()
