#!/usr/bin/env python3
"""launch/bench/trace_gaps.py — where the GPU waits, from a timeline written by
launch/tools/kernel_trace.c (launch/bench/trace_step.sh runs it).

    trace_gaps.py TRACE.csv [--marker NAME] [--every K] [--against OTHER.csv]

The window is one period of the run: from the start of the K-th-from-last launch of the
first kernel whose name contains NAME to the start of the last one (by default the
embedding forward, whose launches open the microbatches: K = the microbatches of a step
gives the last whole step but one where nothing else launches that kernel; the routed forms
launch it twice a microbatch: K = 8). Within it: the GPU's busy time (the union of kernels,
copies and memsets), its idle time, the time of each kind of activity, and the gaps between
consecutive GPU activities summed by what came before and after them, and by the host's
CUDA runtime calls that were under way while the GPU waited.
With --against, the same window of another run's timeline (another build, say) is read too,
and each kernel's time in this window is printed beside its time there, largest changes
first: what moved between two builds, kernel by kernel, one step each.
"""
import argparse
import collections
import sys


def short(name, width=48):
    name = name.replace("void ", "")
    return name.split("(")[0][:width]


def read_trace(path):
    """The GPU's activities and the host's runtime calls, (start, end, name), sorted."""
    gpu, host = [], []
    for line in open(path, errors="replace"):
        fields = line.rstrip("\n").split(",", 3)
        if len(fields) < 3:
            continue
        kind, start, end = fields[0], int(fields[1]), int(fields[2])
        rest = fields[3] if len(fields) > 3 else ""
        if kind == "K":
            gpu.append((start, end, short(rest)))
        elif kind == "C":
            size, copy_kind = rest.split(",")
            direction = {"1": "copy host->device", "2": "copy device->host",
                         "8": "copy device->device"}.get(copy_kind, f"copy kind {copy_kind}")
            gpu.append((start, end, f"{direction} {int(size) / 1e6:.2f} MB"))
        elif kind == "S":
            gpu.append((start, end, "memset"))
        elif kind == "R":
            host.append((start, end, rest))
    gpu.sort()
    host.sort()
    return gpu, host


def step_window(gpu, marker, every, path):
    """(begin, finish, activities) of the window the module's docstring names."""
    marks = [s for s, _, name in gpu if marker in name]
    if len(marks) < every + 1:
        sys.exit(f"trace_gaps: {path}: {len(marks)} launches of '{marker}', need {every + 1}")
    begin, finish = marks[-1 - every], marks[-1]
    return begin, finish, [a for a in gpu if begin <= a[0] < finish]


def kernel_times(window):
    """Each activity's summed time and launch count in the window."""
    times, counts = collections.Counter(), collections.Counter()
    for start, end, name in window:
        times[name] += end - start
        counts[name] += 1
    return times, counts


def print_against(times, counts, other_times, other_counts, at_least_us):
    names = set(times) | set(other_times)
    moved = sorted(names, key=lambda n: times[n] - other_times[n])
    print(f"\nagainst the other run (this window less the other's, changes of at least "
          f"{at_least_us:g} us):")
    for name in moved:
        change = times[name] - other_times[name]
        if abs(change) < at_least_us * 1e3:
            continue
        print(f"{change / 1e6:+8.2f} ms   {times[name] / 1e6:8.2f} ms {counts[name]:5d}x   "
              f"against {other_times[name] / 1e6:8.2f} ms {other_counts[name]:5d}x   {name}")
    total, other_total = sum(times.values()), sum(other_times.values())
    print(f"{(total - other_total) / 1e6:+8.2f} ms   {total / 1e6:8.2f} ms in all against "
          f"{other_total / 1e6:8.2f} ms")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("trace")
    parser.add_argument("--marker", default="embedding_forward")
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--gap-us", type=float, default=5.0, help="gaps listed from this size")
    parser.add_argument("--top", type=int, default=25, help="activities listed by time")
    parser.add_argument("--against", help="another run's timeline: kernel times compared")
    parser.add_argument("--moved-us", type=float, default=150.0,
                        help="the smallest change --against lists")
    args = parser.parse_args()

    gpu, host = read_trace(args.trace)
    begin, finish, window = step_window(gpu, args.marker, args.every, args.trace)

    busy, covered_until = 0, begin
    gaps = []
    previous = None
    for start, end, name in window:
        if start > covered_until and previous is not None:
            gaps.append((start - covered_until, covered_until, start, previous, name))
        clipped_start = max(start, covered_until)
        if end > clipped_start:
            busy += end - clipped_start
            covered_until = end
        previous = name if end >= covered_until else previous
    span = finish - begin
    idle = span - busy
    print(f"window {span / 1e6:.1f} ms ({len(window)} GPU activities): busy {busy / 1e6:.1f} ms, "
          f"idle {idle / 1e6:.1f} ms ({100 * idle / span:.1f}%)")

    by_kernel, count_kernel = kernel_times(window)
    print(f"\nthe GPU's time by activity (in the stream, at the clocks of a running step):")
    for name, size in by_kernel.most_common(args.top):
        print(f"{size / 1e6:8.2f} ms {count_kernel[name]:5d}x  {name}")

    threshold = args.gap_us * 1e3
    by_pair = collections.Counter()
    count_pair = collections.Counter()
    for size, _, _, before, after in gaps:
        key = f"{before}  ->  {after}"
        by_pair[key] += size
        count_pair[key] += 1
    small = sum(g[0] for g in gaps if g[0] < threshold)
    print(f"\ngaps under {args.gap_us:g} us: {small / 1e6:.2f} ms in "
          f"{sum(1 for g in gaps if g[0] < threshold)}; by the activities around them:")
    for key, size in by_pair.most_common(20):
        print(f"{size / 1e6:8.2f} ms {count_pair[key]:5d}x  {key}")

    # the host calls under way during the gaps of at least the threshold
    by_call = collections.Counter()
    j = 0
    for size, gap_start, gap_end, _, _ in sorted(gaps, key=lambda g: g[1]):
        if size < threshold:
            continue
        while j < len(host) and host[j][1] < gap_start:
            j += 1
        k = j
        while k < len(host) and host[k][0] < gap_end:
            overlap = min(host[k][1], gap_end) - max(host[k][0], gap_start)
            if overlap > 0:
                by_call[host[k][2]] += overlap
            k += 1
    print("\nhost runtime calls under way while the GPU waited (gaps of at least "
          f"{args.gap_us:g} us):")
    for call, size in by_call.most_common(12):
        print(f"{size / 1e6:8.2f} ms  {call}")

    if args.against:
        other_gpu, _ = read_trace(args.against)
        _, _, other_window = step_window(other_gpu, args.marker, args.every, args.against)
        print_against(by_kernel, count_kernel, *kernel_times(other_window), args.moved_us)


if __name__ == "__main__":
    main()
