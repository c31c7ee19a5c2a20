"""CPU time for the shared-budget benchmark (bench/budget.py):
thread_cpu() / process_cpu() from /proc, watcher_tids() (the library's
watcher threads), and InterruptTrace, one `perf record` that tells the part
of some threads' time spent in interrupt context (outside_interrupts(),
outside_interrupts_sampled()).

Standard library only (Debian's /usr/bin/python3).
"""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid, tid=None):
    """CPU time of a process (or one of its threads) in seconds; None if
    gone. A thread's comes from /proc/<pid>/task/<tid>/schedstat (its run
    time in ns: stat's utime + stime count whole clock ticks, 10 ms, which
    is a tenth of the watcher's allowance at 9 000 connections over 10 s);
    a process's from /proc/<pid>/stat."""
    if tid is not None:
        try:
            with open("/proc/%d/task/%d/schedstat" % (pid, tid), "rb") as f:
                return int(f.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            pass
    path = "/proc/%d/stat" % pid if tid is None else "/proc/%d/task/%d/stat" % (pid, tid)
    try:
        with open(path, "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14, 15 of stat


def process_cpu(pid):
    """CPU time of all of a process's threads in seconds, from their
    schedstat run times (ns); None if it is gone."""
    total = 0
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return None
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, tid), "rb") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended in between
    return total / 1e9


# Hard and soft interrupt entry/exit tracepoints (x86). Without IRQ time
# accounting (Debian's kernels, this one) a thread's run time includes the
# interrupts handled while it runs: on loopback, the kernel sending paced
# packets and the client receiving them, work that would run anyway and that
# the kernel charges to whatever is on the CPU.
IRQ_EVENTS = ("irq:softirq", "irq:irq_handler", "irq_vectors:local_timer",
              "irq_vectors:call_function", "irq_vectors:call_function_single",
              "irq_vectors:reschedule")


# Frames that put a sampled stack in interrupt context: a hard interrupt's
# entry (and the softirqs run on its exit), or softirqs run where a thread
# enables them again (local_bh_enable), all through handle_softirqs.
IRQ_FRAMES = ("asm_sysvec_", "sysvec_", "asm_common_interrupt",
              "common_interrupt", "__irq_exit_rcu", "irq_exit_rcu",
              "handle_softirqs", "__do_softirq", "do_softirq")
# Stack samples per second of a traced thread's run time.
SAMPLE_HZ = 4999


class InterruptTrace:
    """The time some threads spend in interrupt context, two ways, from start
    until stop(), in one `perf record` on just those threads:
    - bracketed: the kernel's irq and softirq entry/exit tracepoints, nested
      interrupts (a timer during a softirq) counted once. Exact for what they
      bracket, but not all interrupt work lies between them: the entry and
      exit paths, and handle_softirqs' own work between softirq actions
      (on this machine's paravirtualised kernel, interrupts held back while
      a softirq ran are delivered at its irq-enable there: 16% of the
      watchers' samples at 10 000 keys, outside every bracket);
    - sampled: stack samples (SAMPLE_HZ of run time), each in interrupt
      context if an IRQ_FRAMES frame is on its stack (`samples`).
    If perf is missing or refuses, stop() returns None and `error` says
    why."""

    def __init__(self, tids, workdir):
        self.tids = [int(t) for t in tids]
        self.error = None
        self.proc = None
        self.samples = None  # {tid: [samples, in interrupt context]}
        self.data = Path(workdir) / ("irq-%d.perf" % os.getpid())
        self.perf = shutil.which("perf")
        if not self.tids:
            self.error = "no threads to trace"
        elif self.perf is None:
            self.error = "perf not found (Debian package linux-perf)"
        else:
            events = []
            for e in IRQ_EVENTS:
                events += ["-e", e + "_entry", "-e", e + "_exit"]
            events += ["-e", "cpu-clock/freq=%d,call-graph=fp/" % SAMPLE_HZ]
            self.proc = subprocess.Popen(
                [self.perf, "record", "-q", "-o", str(self.data), "-t",
                 ",".join(str(t) for t in self.tids)] + events,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            # Attached once it has written its header (bounded wait).
            deadline = time.monotonic() + 3.0
            while (self.proc.poll() is None and time.monotonic() < deadline
                   and not (self.data.exists() and self.data.stat().st_size > 0)):
                time.sleep(0.05)
            if self.proc.poll() is not None:
                self._failed(self.proc.stderr.read())

    def _failed(self, stderr):
        lines = [x for x in stderr.decode(errors="replace").splitlines() if x.strip()]
        self.error = "perf record failed: %s" % " ".join(lines[:2])
        self.proc = None

    def stop(self):
        """{tid: seconds in interrupt context}, or None (see error)."""
        if self.proc is None:
            return None
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.error = "perf record did not stop"
            return None
        if self.proc.returncode not in (0, -signal.SIGINT) or b"Error" in err:
            self._failed(err)
            return None
        try:
            out = subprocess.run(
                [self.perf, "script", "-i", str(self.data), "--ns", "-F",
                 "tid,time,event,ip,sym"], capture_output=True, text=True,
                timeout=300).stdout
        except (OSError, subprocess.SubprocessError) as e:
            self.error = "perf script: %s" % e
            return None
        finally:
            try:
                self.data.unlink()
            except OSError:
                pass
        depth, since, spent = {}, {}, {t: 0.0 for t in self.tids}
        self.samples = {t: [0, 0] for t in self.tids}
        sample = None  # [tid, in interrupt context] of the stack being read

        def count(sample):
            if sample is not None:
                counts = self.samples.setdefault(sample[0], [0, 0])
                counts[0] += 1
                counts[1] += sample[1]

        for line in out.splitlines():
            if line.startswith("\t"):
                # A frame of the last stack sample: "<ip> <symbol>" (the
                # other lines begin with the tid, padded with spaces).
                frame = line.split()
                if (sample is not None and not sample[1] and len(frame) > 1
                        and frame[1].startswith(IRQ_FRAMES)):
                    sample[1] = 1
                continue
            count(sample)
            sample = None
            parts = line.split()
            if len(parts) < 3:
                continue
            try:
                tid, at = int(parts[0]), float(parts[1].rstrip(":"))
            except ValueError:
                continue
            event = parts[2].rstrip(":")
            if event.startswith("cpu-clock"):
                sample = [tid, 0]
            elif event.endswith("_entry"):
                if depth.get(tid, 0) == 0:
                    since[tid] = at
                depth[tid] = depth.get(tid, 0) + 1
            elif event.endswith("_exit") and depth.get(tid, 0) > 0:
                depth[tid] -= 1
                if depth[tid] == 0:
                    spent[tid] = spent.get(tid, 0.0) + at - since.pop(tid)
        count(sample)
        # No event at all: no interrupt came while they ran (an upper bound
        # for their own CPU either way).
        return spent

    def sample_totals(self):
        """[stack samples, in interrupt context] over all threads, or None
        before stop() counted them."""
        if self.samples is None:
            return None
        return [sum(n for n, _ in self.samples.values()),
                sum(i for _, i in self.samples.values())]


def outside_interrupts(run_s, irq_s):
    """Threads' CPU seconds outside interrupts: their run time run_s less
    what InterruptTrace.stop() returned for them; None if that is None."""
    return None if irq_s is None else max(0.0, run_s - sum(irq_s.values()))


def outside_interrupts_sampled(run_s, trace):
    """Threads' CPU seconds outside interrupts by their stack samples: run_s
    times the part of trace's samples (InterruptTrace, stopped) not in
    interrupt context; None without samples."""
    totals = None if trace is None else trace.sample_totals()
    if not totals or totals[0] == 0:
        return None
    return run_s * (totals[0] - totals[1]) / totals[0]


def watcher_tids(pid, name="trafficrate"):
    """Threads of pid named `name` (the library's watcher sets it)."""
    tids = []
    try:
        for entry in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/comm" % (pid, entry)) as f:
                    if f.read().strip() == name:
                        tids.append(int(entry))
            except OSError:
                pass
    except OSError:
        pass
    return tids
