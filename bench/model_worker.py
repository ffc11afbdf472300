#!/usr/bin/env python3
"""A GPT-2-shaped model worker for the gpu-agent MPS benchmarks (random weights, nothing downloaded).

Started by gpu-agent as a model worker. It loads a GPT2LMHeadModel (fp16, eval, no_grad) with random
weights, optionally tries one large allocation (--alloc-mib), warms up, prints READY, and then:
  - with --duration S > 0: waits for the common start time (--start-at UNIX_SECONDS, or the first
    number in --start-file once that file exists), runs closed-loop inference for S seconds (one
    request = one forward pass of --batch x --tokens, followed by a synchronize) and writes
    OUT/<GPU_AGENT_MODEL>-<GPU_AGENT_REPLICA>.json atomically;
  - then stays alive until SIGTERM (sleeping, or with --idle-interval, one request every so often),
    and exits 0 on SIGTERM.

Lines printed (stdout, flushed): `MPS=<CUDA_MPS_PIPE_DIRECTORY or none>` at start, `ALLOC OK N`,
`OOM: <message>` or `ALLOC FAILED: <error>` for --alloc-mib, `READY` once warmed up, `DONE <requests>` after the measurement.

--fake replaces torch with sleeps (no GPU, no torch needed) so the orchestration can be tested
anywhere; its numbers mean nothing.
"""
import argparse
import json
import os
import signal
import sys
import threading
import time
import traceback

T0 = time.time()


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=0, help="attention heads (default: 12 if hidden %% 12 == 0, else 16, else 8)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--warmup", type=int, default=20, help="forward passes before READY")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start-at", type=float, default=None, help="UNIX time at which the measurement starts")
    p.add_argument("--start-file", default=None, help="wait for this file; its first number is the start time")
    p.add_argument("--start-timeout", type=float, default=300.0, help="give up waiting for the start after this long")
    p.add_argument("--duration", type=float, default=0.0, help="seconds of closed-loop measurement (0: none)")
    p.add_argument("--out", default=None, help="directory for the result JSON")
    p.add_argument("--alloc-mib", type=int, default=0, help="after loading, try to allocate this many MiB")
    p.add_argument("--idle-interval", type=float, default=0.0,
                   help="after the measurement, one request every this many seconds until SIGTERM (0: sleep)")
    p.add_argument("--term-grace", type=float, default=1.0,
                   help="on SIGTERM, exit at the latest this long after it even if a GPU call hangs")
    p.add_argument("--fake", action="store_true", help="no torch: sleep instead of computing (tests only)")
    p.add_argument("--device", default="cuda", help="torch device (cpu: test the model code without a GPU)")
    return p.parse_args(argv)


def heads_for(hidden, heads):
    if heads:
        return heads
    for h in (12, 16, 8, 4, 2, 1):
        if hidden % h == 0:
            return h
    return 1


class Stop:
    """SIGTERM/SIGINT handling that works even while the main thread is stuck in a GPU call.

    Both signals are blocked in every thread (the mask is set before torch starts any thread), and a
    dedicated thread takes them with sigwait: it sets the flag the main loop checks, and exits the
    process itself after the grace period if the main thread has not (e.g. a client of a dead MPS
    server hanging in a CUDA call). Exit is always os._exit(0): no interpreter or CUDA teardown."""

    def __init__(self, grace):
        self.event = threading.Event()
        self.grace = grace
        sigs = {signal.SIGTERM, signal.SIGINT}
        signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
        threading.Thread(target=self._wait, args=(sigs,), daemon=True).start()

    def _wait(self, sigs):
        sig = signal.sigwait(sigs)
        self.event.set()
        time.sleep(self.grace)
        say(f"STOP: signal {sig}, main thread did not finish within {self.grace}s; exiting")
        os._exit(0)

    def is_set(self):
        return self.event.is_set()

    def wait(self, timeout=None):
        return self.event.wait(timeout)

    def exit(self):
        say("STOPPED")
        os._exit(0)


class FakeModel:
    """Sleeps about as long as a small model's forward pass; for testing the orchestration."""

    def __init__(self, a):
        import random
        self.rng = random.Random(a.seed * 1000 + int(os.environ.get("GPU_AGENT_REPLICA", "0") or 0))
        self.base = min(0.05, 0.004 * max(1, a.layers * a.hidden * a.batch * a.tokens) / (6 * 768 * 32))

    def step(self):
        time.sleep(self.base * (1 + 0.3 * self.rng.random()))

    def info(self):
        return {"backend": "fake"}

    def alloc(self, mib):
        limit = int(os.environ.get("GPU_AGENT_MEMORY_MIB", "0") or 0)
        if limit and mib > limit:
            raise MemoryError(f"fake: {mib} MiB is more than the budget of {limit} MiB")
        return bytearray(1)


class TorchModel:
    def __init__(self, a):
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel
        self.torch = torch
        self.device = a.device
        self.cuda = a.device.startswith("cuda")
        torch.manual_seed(a.seed)
        self.cfg = GPT2Config(n_embd=a.hidden, n_layer=a.layers, n_head=heads_for(a.hidden, a.heads),
                              n_positions=max(1024, a.tokens))
        self.model = self._build(GPT2LMHeadModel)
        self.ids = torch.randint(0, self.cfg.vocab_size, (a.batch, a.tokens), device=self.device)
        self.sync()

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def _build(self, cls):
        torch = self.torch
        # Fast path: initialise straight on the GPU in fp16 (no fp32 copy on the CPU; matters for the
        # 1.3B-parameter aggressor). Falls back to the classic CPU init if this torch/transformers
        # pair does not support it.
        prev = torch.get_default_dtype()
        try:
            torch.set_default_dtype(torch.float16)
            with torch.device(self.device):
                m = cls(self.cfg)
            return m.half().eval()
        except Exception as e:  # noqa: BLE001 - any failure: take the slow, well-trodden path
            say(f"NOTE: fp16 init on {self.device} failed ({type(e).__name__}: {one_line(e)}); building on the CPU")
            if self.cuda:
                torch.cuda.empty_cache()
        finally:
            torch.set_default_dtype(prev)
        return cls(self.cfg).half().to(self.device).eval()

    def step(self):
        with self.torch.no_grad():
            self.model(self.ids)
        self.sync()

    def info(self):
        torch = self.torch
        import transformers
        params = sum(p.numel() for p in self.model.parameters())
        return {
            "backend": "torch",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "gpu_name": torch.cuda.get_device_name(0) if self.cuda else self.device,
            "params": params,
            "dtype": str(next(self.model.parameters()).dtype),
            "memory_allocated_mib": round(torch.cuda.memory_allocated() / 2**20, 1) if self.cuda else None,
            "attn_implementation": getattr(self.cfg, "_attn_implementation", None),
        }

    def alloc(self, mib):
        x = self.torch.empty(mib * 2**20, dtype=self.torch.uint8, device=self.device)
        self.sync()
        return x


def one_line(e):
    return " ".join(str(e).split())[:600]


def is_oom(e):
    """torch.OutOfMemoryError (torch.cuda.OutOfMemoryError on older torch), or a CUDA error that says so."""
    torch = sys.modules.get("torch")
    for mod, name in ((torch, "OutOfMemoryError"), (getattr(torch, "cuda", None), "OutOfMemoryError")):
        cls = getattr(mod, name, None) if mod is not None else None
        if isinstance(cls, type) and isinstance(e, cls):
            return True
    return isinstance(e, MemoryError) or "out of memory" in str(e).lower()


def start_time(a, stop):
    """The common start time: --start-at, or the number in --start-file once it appears."""
    if a.start_at is not None:
        return a.start_at
    if not a.start_file:
        return time.time()
    deadline = time.time() + a.start_timeout
    while time.time() < deadline:
        if stop.is_set():
            stop.exit()
        try:
            with open(a.start_file) as f:
                text = f.read().split()
            if text:
                return float(text[0])
        except (OSError, ValueError):
            pass
        time.sleep(0.005)
    raise TimeoutError(f"no start time in {a.start_file} after {a.start_timeout}s")


def measure(a, m, stop):
    start = start_time(a, stop)
    late = max(0.0, time.time() - start)
    while time.time() < start:
        if stop.is_set():
            stop.exit()
        time.sleep(min(0.001, max(0.0, start - time.time())))
    end = start + a.duration
    lat = []
    while True:
        if stop.is_set():
            stop.exit()
        t = time.perf_counter()
        m.step()
        dt = time.perf_counter() - t
        if time.time() > end:
            break
        lat.append(dt)
    return start, late, time.time() - start, lat


def write_result(a, doc):
    model = os.environ.get("GPU_AGENT_MODEL", "local")
    replica = os.environ.get("GPU_AGENT_REPLICA", "0")
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"{model}-{replica}.json")
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def main(argv):
    a = parse(argv)
    stop = Stop(a.term_grace)
    say(f"MPS={os.environ.get('CUDA_MPS_PIPE_DIRECTORY') or 'none'}")
    say(f"START pid={os.getpid()} model={os.environ.get('GPU_AGENT_MODEL', '-')} replica={os.environ.get('GPU_AGENT_REPLICA', '-')}"
        f" device={os.environ.get('CUDA_VISIBLE_DEVICES', '-')} threads={os.environ.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE', '-')}"
        f" pinned={os.environ.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT', '-')} config={a.layers}x{a.hidden} b={a.batch} t={a.tokens}")
    m = FakeModel(a) if a.fake else TorchModel(a)
    loaded = time.time() - T0
    held = []  # an allocation that succeeds is held for the worker's whole life
    if a.alloc_mib > 0:
        try:
            held.append(m.alloc(a.alloc_mib))
            say(f"ALLOC OK {a.alloc_mib}")
        except Exception as e:  # noqa: BLE001 - report any failure and keep serving
            if is_oom(e):
                say(f"OOM: {one_line(e)}")
            else:
                say(f"ALLOC FAILED: {type(e).__name__}: {one_line(e)}")
            if not a.fake and m.cuda:
                m.torch.cuda.empty_cache()
    for _ in range(a.warmup):
        if stop.is_set():
            stop.exit()
        m.step()
    ready = time.time() - T0
    say(f"READY load_s={loaded:.2f} ready_s={ready:.2f}")
    if a.duration > 0:
        start, late, measured, lat = measure(a, m, stop)
        doc = {
            "model": os.environ.get("GPU_AGENT_MODEL"),
            "replica": os.environ.get("GPU_AGENT_REPLICA"),
            "pid": os.getpid(),
            "isolation": os.environ.get("GPU_AGENT_ISOLATION"),
            "device": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "mps_pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
            "active_thread_percentage": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
            "pinned_limit": os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
            "config": {"layers": a.layers, "hidden": a.hidden, "heads": heads_for(a.hidden, a.heads),
                       "batch": a.batch, "tokens": a.tokens},
            "start_at": start,
            "late_s": late,
            "duration_s": a.duration,
            "measured_s": measured,
            "load_s": loaded,
            "ready_s": ready,
            "requests": len(lat),
            "info": m.info(),
            "latencies_s": lat,
        }
        path = write_result(a, doc)
        say(f"DONE {len(lat)} requests -> {path}")
    while not stop.is_set():
        if a.idle_interval > 0:
            if stop.wait(a.idle_interval):
                break
            m.step()
        else:
            stop.wait(3600)
    say(f"EXIT held={len(held)}")
    stop.exit()


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except SystemExit as e:  # argparse: --help, bad usage
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(e.code if isinstance(e.code, int) else 1)
    except BaseException:  # noqa: BLE001 - report and leave without interpreter/CUDA teardown
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
