"""One Nexmark query on one or both engines: per-phase medians of its batches, for quick checks.

    .venv/bin/python -m bench.nexmark_one q11 lockgate,native --rate 10000 --batches 8

Runs the query (``bench.nexmark_queries``) with the noop sink until ``--batches`` batches
with input ran after 3 warm-up batches, then prints the median of each ``durationMs`` key
and of each state operator's times. Engines run one after the other, not interleaved: use
``bench.nexmark`` for figures to compare; this is for seeing where a batch's time goes.
"""

from __future__ import annotations

import argparse

from bench.one import local_spark, print_medians, run_batches


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.nexmark_one", description=__doc__.splitlines()[0])
    parser.add_argument("query", help="e.g. q11")
    parser.add_argument("engines", nargs="?", default="lockgate,native", help="lockgate, native or both")
    parser.add_argument("--rate", type=int, default=10_000, help="events per batch")
    parser.add_argument("--batches", type=int, default=8)
    args = parser.parse_args()

    import lockgate
    from bench.nexmark_queries import QUERIES, Config

    spark = local_spark()
    ls = lockgate.session(spark)
    query = QUERIES[args.query]
    for engine in args.engines.split(","):
        readers = (lambda: spark.readStream) if engine == "native" else (lambda: ls.readStream)
        df = query.build(readers, Config(rows_per_batch=args.rate))
        ran = run_batches(df, query.output_mode, args.batches)
        print_medians(f"{engine} {args.query} at {args.rate:,} events per batch:", ran, operators=None)
    spark.stop()


if __name__ == "__main__":
    main()
