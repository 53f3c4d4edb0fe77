"""Two builds of `transmuter` on one model, alternating round by round: the median ratio B / A of
their `transmuter bench` medians, for judging one change on a host where single runs vary by up to 2x.

    .venv/bin/python bench/ab_binaries.py BIN_A BIN_B ROUNDS -- MODEL --input NAME=FILE.npy ... [bench options]

Prints the median latency of each and the median, min and max of the per-round ratios, with the load
average at the end. A ratio whose min and max straddle 1 measured nothing.
"""
import re
import statistics
import subprocess
import sys


def median_latency(binary: str, bench_args: list[str]) -> float:
    result = subprocess.run([binary, "bench", *bench_args], capture_output=True, text=True, check=True)
    match = re.search(r"median ([\d.]+)", result.stdout)
    if match is None:
        raise SystemExit(f"{binary} bench printed no median:\n{result.stdout}{result.stderr}")
    return float(match.group(1))


def main() -> None:
    if "--" not in sys.argv or len(sys.argv) < 5:
        raise SystemExit(__doc__)
    a, b, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    bench_args = sys.argv[sys.argv.index("--") + 1:]
    times_a, times_b = [], []
    for _ in range(rounds):
        times_a.append(median_latency(a, bench_args))
        times_b.append(median_latency(b, bench_args))
    ratios = [tb / ta for ta, tb in zip(times_a, times_b)]
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"A median {statistics.median(times_a):.2f} ms  B median {statistics.median(times_b):.2f} ms  "
          f"B/A {statistics.median(ratios):.3f} (min {min(ratios):.3f} max {max(ratios):.3f})  load {load}")


if __name__ == "__main__":
    main()
