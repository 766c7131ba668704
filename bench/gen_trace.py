"""Write a synthetic trace (``schedtrace.testing.synthetic``) from the shell.

    python -m bench.gen_trace OUT.trace --passes 1000000 [--report OUT.json] [--seed 7]
"""

from __future__ import annotations

import click

from schedtrace.testing.synthetic import generate


@click.command()
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--passes", type=int, default=1000, show_default=True)
@click.option("--seed", type=int, default=7, show_default=True)
@click.option("--report", "report_path", type=click.Path(dir_okay=False), help="Also write a matching replay report.")
def main(out: str, passes: int, seed: int, report_path: str | None) -> None:
    report = generate(out, passes, seed=seed, report_path=report_path)
    click.echo(f"{out}: {passes} passes, {len(report.divergences)} divergences")


if __name__ == "__main__":
    main()
