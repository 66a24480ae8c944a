"""`eagle3conv verify` in a fresh process from a truly cold page cache, read-ahead schedules side by side.

``bench_verify_gpu.py --sections fresh`` drops the page cache from a process that has imported torch,
so the pages of torch's shared libraries that process maps stay cached: its "cold, all" is cold for
Python's files and the inputs, not for torch's libraries. This driver never imports torch: the
drafters (Kimi-K2.5-size Llama and MLA, random bf16) and the 96 x 2048 states file are written, and
the chain timed, by a child process (``--make``) that exits before anything is measured; each
measured case runs ``eagle3conv verify DRAFTER --states FILE --json --no-save`` in a fresh process
after ``/proc/sys/vm/drop_caches`` (or, for "cold, inputs", ``posix_fadvise(DONTNEED)`` on the inputs
only), next to a plain 16 MiB read loop of the same files in the same cache state.

Each schedule is the console's own read-ahead (``eagle3conv/console.py``) with a setting changed in
the child before ``console.run()`` (``--child``): the code under test is the package's.

    PYTHONUNBUFFERED=1 PYTHONPATH=. python3 bench/fresh_cold.py          # JSON to $OUT/fresh_cold.json
    PYTHONPATH=. .venv/bin/python bench/fresh_cold.py --small --out /tmp/fc.json   # CPU smoke test

Needs root for drop_caches (the device machine runs as root); without it every "cold, all" case is
reported as not run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from shared import drop_caches, read_loop, timed_verify  # noqa: E402  (torch-free: the driver never imports torch)

# name -> how the child changes the console before running it. Run 1 (bench/results/
# fresh_cold_h200_2026-12-01_run1.json, this script at 9ff1dd7) also had "full" (read-ahead from the
# start), "4 x 1 MiB", "2 x 1 MiB" (smaller reads) and "full, idle priority" (IOPRIO_CLASS_IDLE
# readers): each slower than the first two below, so they went. Run 2 (this script at e722740) also timed
# load_drafter_weights + build_drafter with a library read-ahead of cold weights: mixed (MLA 0.88x
# a plain read against 1.07x without, Llama 1.36x against 1.26x), so that went too.
SCHEDULES: dict[str, dict] = {
    # the package as it is: with torch's own files cold, torch is imported first, then read ahead
    "as shipped": {},
    # the code before: with torch's own files cold, no read-ahead at all
    "before: none while torch is cold": {"none_while_torch_cold": True},
    # run 3: while torch is imported, one thread reads 2 MiB at a time with the kernel's read-ahead
    # off for its descriptors (POSIX_FADV_RANDOM: nothing more in flight than that one read), then
    # the shipped read-ahead takes over
    "one 2 MiB read at a time during the import": {"gentle_import": True},
}


def log(*a) -> None:
    print("[fresh_cold]", *a, file=sys.stderr, flush=True)


def fadvise_out(files: list[Path]) -> None:
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def system_info(work: Path) -> dict:
    """The disk the inputs live on and how the kernel queues its reads (for the idle-priority case)."""
    info: dict = {"kernel": os.uname().release, "python": sys.version.split()[0], "cpus": os.cpu_count()}
    try:
        src = subprocess.run(["findmnt", "-no", "SOURCE,FSTYPE", "--target", str(work)], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        info["mount"] = src
    except (OSError, subprocess.SubprocessError):
        pass
    queues = {}
    for q in sorted(Path("/sys/block").glob("*/queue")):
        row = {}
        for name in ("scheduler", "read_ahead_kb", "nr_requests", "max_sectors_kb", "rotational"):
            try:
                row[name] = (q / name).read_text().strip()
            except OSError:
                pass
        queues[q.parent.name] = row
    info["block_queues"] = queues
    return info


# --------------------------------------------------------------------------- child: write the inputs


def make(work: Path, small: bool, seqs: int) -> None:
    """Write both drafters and the states file, time each drafter's chain at B=8 (the bound's compute
    term), print one JSON line. Runs in its own process, which exits before anything is measured."""
    import torch

    sys.path.insert(0, str(HERE))
    import bench_verify_gpu as b
    from eagle3conv.verify import build_drafter, load_drafter_weights

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    d, dm = b.make_dims(small), b.make_mla_dims(small)
    S = 64 if small else 2048
    out: dict = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__}
    out["llama"] = b.write_drafter(work / "drafter", d, (2, 30, 58), dev)
    out["mla"] = b.write_mla_drafter(work / "drafter-mla", dm, (2, 30, 58), dev)
    out["states"] = b.write_shared_states(work / "states.safetensors", d, dev, seqs, S)
    B = 8
    for fam, folder, dims in (("llama", work / "drafter", d), ("mla", work / "drafter-mla", dm)):
        config, tensors = load_drafter_weights(folder)
        drafter, _ = build_drafter(config, tensors, dev, torch.bfloat16)
        del tensors
        gen = torch.Generator(device=dev).manual_seed(1)
        drafter.embed_tokens = (torch.randn(dims["V"], dims["H"], generator=gen, device=dev) * 0.02).to(torch.bfloat16)
        aux = torch.randn(B, S, dims["k"] * dims["T"], generator=gen, device=dev).to(torch.bfloat16)
        ids = torch.randint(0, dims["V"], (B, S), generator=gen, device=dev)
        ts = sorted(b.time_gpu(lambda: drafter.draft_chain(aux, ids, 3), dev, 2, 5))
        out[fam]["chain_B8_s"] = round(ts[len(ts) // 2], 4)
        out[fam]["chain_compute_s"] = round(ts[len(ts) // 2] * -(-seqs // B), 3)
        del drafter, aux, ids
        if dev == "cuda":
            torch.cuda.empty_cache()
    print(json.dumps(out))


# --------------------------------------------------------------------------- child: one verify


def child(schedule: str, argv: list[str]) -> None:
    """``eagle3conv verify`` through the package's console, with the schedule's change applied."""
    t0 = time.perf_counter()  # (the console's own clock starts as it is imported, just below)
    from eagle3conv import console

    s = SCHEDULES[schedule]
    if s.get("none_while_torch_cold"):
        own_start = console.start_read_ahead

        def start_unless_torch_cold(argv_, info):
            if console.verify_inputs(argv_) and not console.torch_cached():
                info["read_ahead"] = "torch's own files are cold (the code before: no read-ahead)"
                return False
            return own_start(argv_, info)

        console.start_read_ahead = start_unless_torch_cold
    if s.get("gentle_import"):
        import threading

        own_start2 = console.start_read_ahead

        def gentle(files, stop, info):
            t = time.perf_counter()
            n = 0
            buf = memoryview(bytearray(2 << 20))
            plan = [span for i, p in enumerate(files) for span in console.read_plan(p, striped=i == len(files) - 1)]
            fds: dict = {}
            try:
                for path, off, length in plan:
                    fd = fds.get(path)
                    if fd is None:
                        fd = fds[path] = os.open(path, os.O_RDONLY)
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                    end = off + length
                    while off < end:
                        if stop.is_set():
                            return
                        got = os.preadv(fd, [buf[: min(len(buf), end - off)]], off)
                        if not got:
                            break
                        off += got
                        n += got
            finally:
                for fd in fds.values():
                    os.close(fd)
                info["gentle_bytes"] = n
                info["gentle_s"] = round(time.perf_counter() - t, 3)

        def start_gentle(argv_, info):
            files = console.verify_inputs(argv_)
            if files and not console.cached(files) and not console.torch_cached():
                stop = threading.Event()
                th = threading.Thread(target=gentle, args=(files, stop, info), daemon=True)
                th.start()
                import torch  # noqa: F401

                info["gentle_import_done"] = round(time.perf_counter() - t0, 3)
                stop.set()
                th.join()
            return own_start2(argv_, info)

        console.start_read_ahead = start_gentle
    sys.argv = ["eagle3conv", *argv]
    console.run()


# --------------------------------------------------------------------------- the driver


def run_verify(schedule: str, folder: Path, states: Path, dev: str, timeout: float) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", schedule, "--", "verify", str(folder),
           "--states", str(states), "--device", dev, "--no-save", "--json"]
    return timed_verify(cmd, dict(os.environ, EAGLE3CONV_PHASES="1", PYTHONUNBUFFERED="1"), timeout)


def reference_import(dev: str) -> float:
    code = f"import torch; torch.zeros(1, device={dev!r})"
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return round(time.perf_counter() - t, 3)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[4:] if sys.argv[3:4] == ["--"] else sys.argv[3:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="tiny shapes (a CPU smoke test)")
    ap.add_argument("--make", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", default="/tmp/eagle3conv-bench-fresh")
    ap.add_argument("--seqs", type=int, default=96)
    ap.add_argument("--reps", type=int, default=2, help="rounds of every case (the order reversed each round)")
    ap.add_argument("--schedules", default=";".join(SCHEDULES), help="';' separated, from: " + "; ".join(SCHEDULES))
    ap.add_argument("--families", default="llama,mla")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    work = Path(args.workdir)
    if args.make:
        make(work, args.small, args.seqs)
        return 0
    if "torch" in sys.modules:  # the point of this driver
        raise SystemExit("the driver must not import torch")
    out_path = Path(args.out or os.path.join(os.environ.get("OUT", "/tmp"), "fresh_cold.json"))
    work.mkdir(parents=True, exist_ok=True)
    res: dict = {"system": system_info(work)}
    log("system", res["system"])

    def dump() -> None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(res, indent=1))

    t = time.perf_counter()
    p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--make", "--workdir", str(work),
                        "--seqs", str(3 if args.small else args.seqs)] + (["--small"] if args.small else []),
                       capture_output=True, text=True, check=True)
    res["inputs"] = json.loads(p.stdout.strip().splitlines()[-1])
    res["inputs"]["make_s"] = round(time.perf_counter() - t, 1)
    log("inputs", res["inputs"])
    dump()
    dev = "cuda" if res["inputs"]["device"] != "cpu" else "cpu"
    states = work / "states.safetensors"
    folders = {"llama": work / "drafter", "mla": work / "drafter-mla"}
    schedules = [s for s in args.schedules.split(";") if s]
    for s in schedules:
        if s not in SCHEDULES:
            raise SystemExit(f"unknown schedule {s!r}")
    can_drop = drop_caches()
    res["drop_caches"] = can_drop
    ref: dict = {"import_torch_cuda_init_cold_s": [], "import_torch_cuda_init_warm_s": []}
    rows: dict = {fam: {"read_cold_all_s": [], "read_cold_inputs_s": [], "read_warm_s": [], "cases": {}}
                  for fam in args.families.split(",")}
    for rnd in range(args.reps):
        if can_drop:
            drop_caches()
            ref["import_torch_cuda_init_cold_s"].append(reference_import(dev))
        ref["import_torch_cuda_init_warm_s"].append(reference_import(dev))
        res["reference"] = ref
        for fam, row in rows.items():
            folder = folders[fam]
            files = sorted(folder.glob("*.safetensors")) + [folder / "config.json", states]
            cases = [("cold, all: " + s, s) for s in schedules] + [("cold, inputs: as shipped", "as shipped"),
                                                                    ("warm: as shipped", "as shipped")]
            if rnd % 2:
                cases.reverse()
            if can_drop:
                drop_caches()
                row["read_cold_all_s"].append(round(read_loop(files)[0], 3))
            fadvise_out(files)
            row["read_cold_inputs_s"].append(round(read_loop(files)[0], 3))
            row["read_bytes"] = read_loop(files)[1]
            row["read_warm_s"].append(round(read_loop(files)[0], 3))
            for label, schedule in cases:
                if label.startswith("cold, all"):
                    if not can_drop:
                        row["cases"].setdefault(label, []).append({"not run": "drop_caches needs root"})
                        continue
                    drop_caches()
                elif label.startswith("cold, inputs"):
                    fadvise_out(files)
                else:
                    read_loop(files)
                r = run_verify(schedule, folder, states, dev, timeout=300)
                r["round"] = rnd
                row["cases"].setdefault(label, []).append(r)
                log(fam, label, r)
                res["families"] = rows
                dump()
    # ratios: each case against the bound of its own cache state (the larger of its read loop's median
    # and the chain's compute), the "within 1.5x"
    import statistics

    summary: dict = {}
    for fam, row in rows.items():
        chain = res["inputs"][fam].get("chain_compute_s") or 0.0
        s: dict = {"chain_compute_s": chain}
        for label, runs in row["cases"].items():
            walls = [r["wall_s"] for r in runs if "wall_s" in r and r.get("exit_code") in (0, 4)]
            if not walls:
                continue
            key = "read_cold_all_s" if label.startswith("cold, all") else (
                "read_cold_inputs_s" if label.startswith("cold, inputs") else "read_warm_s")
            loop = statistics.median(row[key]) if row[key] else 0.0
            bound = max(loop, chain)
            s[label] = {"walls_s": walls, "median_wall_s": round(statistics.median(walls), 3),
                        "bound_s": round(bound, 3),
                        "ratio_to_bound": round(statistics.median(walls) / bound, 3) if bound else None}
            if label.startswith("warm"):  # the issue's own term: its disk read is a cold read
                cold = statistics.median(row["read_cold_all_s"] or row["read_cold_inputs_s"])
                s[label]["ratio_to_cold_read"] = round(statistics.median(walls) / max(cold, chain), 3)
        summary[fam] = s
    res["summary"] = summary
    dump()
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
