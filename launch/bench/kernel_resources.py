#!/usr/bin/env python3
"""launch/bench/kernel_resources.py — what ptxas gives each CUDA kernel: registers, stack frame
and spills, for every kernel of the build, from the build machine (no GPU needed).

Each .cu file of build/compile_commands.json is compiled again with its own command, to a
cubin in a temporary folder, with -Xptxas -v; only the sm_90a code is kept (the compute_90
PTX is dropped). A stack frame where the code keeps nothing on the stack is a trip through
local memory: a union built in pieces, an array indexed at run time (docs/performance.md,
"2026-12-07 (noon)": vector_from_floats<4> put one in 27 kernels).

  launch/bench/kernel_resources.py [--build build] [--jobs N] [--out FILE] [--against FILE]
                                   [FILTER ...]

FILTER: only the .cu files whose name contains one of them. Prints the kernels with a stack
frame or spills; with --out, every kernel's row goes to FILE (tab-separated); with --against
a FILE from another tree, the kernels whose numbers differ from it, side by side.
"""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

ENTRY = re.compile(r"Compiling entry function '([^']+)' for 'sm_90a'")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers")
FIELDS = ("registers", "stack", "spill_stores", "spill_loads")


def cubin_command(entry, folder):
    """the file's compile command, making a cubin for sm_90a alone, ptxas verbose"""
    words, keep, skip = shlex.split(entry["command"]), [], False
    for word in words[1:]:
        if skip:
            skip = False
        elif word in ("-o", "-MF"):
            skip = True
        elif word in ("-c", "-MD", "-lineinfo") or word.startswith("-gencode=arch=compute_90,"):
            continue
        else:
            keep.append(word)
    cubin = os.path.join(folder, os.path.basename(entry["output"]) + ".cubin")
    return [os.environ.get("FATHOM_NVCC", "nvcc")] + keep + ["-cubin", "-o", cubin,
                                                             "-Xptxas", "-v"]


def kernels_of(entry, folder):
    """[(file, mangled name, registers, stack, spill stores, spill loads)] of one .cu file"""
    run = subprocess.run(cubin_command(entry, folder), cwd=entry["directory"],
                         capture_output=True, text=True)
    name = os.path.basename(entry["file"])
    if run.returncode != 0:
        sys.exit(f"kernel_resources: {name} did not compile:\n{run.stderr}")
    rows, current, frame = [], None, None
    for line in run.stderr.splitlines():
        if m := ENTRY.search(line):
            current, frame = m.group(1), None
        elif (m := FRAME.search(line)) and current:
            frame = tuple(int(x) for x in m.groups())
        elif (m := USED.search(line)) and current and frame:
            rows.append((name, current, int(m.group(1))) + frame)
            current = None
    return rows


def demangled(names):
    run = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return run.stdout.splitlines() if run.returncode == 0 else list(names)


def read_rows(path):
    with open(path) as table:
        lines = [line.rstrip("\n").split("\t") for line in table if line.strip()]
    return {(r[0], r[1]): tuple(int(x) for x in r[2:6]) for r in lines[1:]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--out")
    parser.add_argument("--against")
    parser.add_argument("filters", nargs="*")
    args = parser.parse_args()
    with open(os.path.join(args.build, "compile_commands.json")) as commands:
        entries = [e for e in json.load(commands) if e["file"].endswith(".cu")]
    entries = [e for e in entries
               if not args.filters or any(f in os.path.basename(e["file"]) for f in args.filters)]
    if not entries:
        sys.exit("kernel_resources: no .cu file in compile_commands.json matches")
    print(f"kernel_resources: {len(entries)} files, {args.jobs} at a time", file=sys.stderr)
    with tempfile.TemporaryDirectory() as folder, \
            concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        rows = sorted(r for rs in pool.map(lambda e: kernels_of(e, folder), entries) for r in rs)
    names = demangled([r[1] for r in rows])
    if args.out:
        with open(args.out, "w") as table:
            table.write("file\tkernel\t" + "\t".join(FIELDS) + "\tdemangled\n")
            for r, name in zip(rows, names):
                table.write("\t".join(str(x) for x in r) + f"\t{name}\n")
    flagged = [(r, n) for r, n in zip(rows, names) if r[3] or r[4] or r[5]]
    print(f"{len(rows)} kernels; {len(flagged)} with a stack frame or spills "
          "(registers, stack, spill stores, spill loads: bytes):")
    for r, name in flagged:
        print(f"  {r[2]:4d} {r[3]:4d} {r[4]:4d} {r[5]:4d}  {r[0]}  {name}")
    if args.against:
        before = read_rows(args.against)
        changed = [(r, n) for r, n in zip(rows, names) if before.get((r[0], r[1]), r[2:]) != r[2:]]
        print(f"against {args.against}: {len(changed)} kernels differ (before -> now):")
        for r, name in changed:
            old = before[(r[0], r[1])]
            print("  " + ", ".join(f"{f} {a} -> {b}" for f, a, b in zip(FIELDS, old, r[2:])
                                   if a != b) + f"  {r[0]}  {name}")
        gone = set(before) - {(r[0], r[1]) for r in rows}
        if gone:
            print(f"  and {len(gone)} kernels of {args.against} are no longer built")


if __name__ == "__main__":
    main()
