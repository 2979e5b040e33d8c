"""The demo: a slow node drags the cluster's P99 up, tailguard takes it out, then lets it back in.

``python -m tailguard.demo`` (what ``./scripts/demo`` runs): the command line.
It prints the plan's detector settings and why they differ from the
defaults, runs the story once (:func:`tailguard.demo.observe.run_story`) with a
live screen, then prints the report, saves the observations
(``out/demo.json``) and draws ``out/demo.png``. ``--fast`` runs the
end-to-end test's plan (1-s ticks); ``--replot JSON`` runs nothing and
redraws a saved run. SIGINT/SIGTERM cancel the story, whose cleanup stops
every child and deletes the run's topics and keys. Exit status: 0 when the
story is complete (removed, P99 back, re-admitted), 1 when not or when the
demo failed, 130/143 when stopped by a signal.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tailguard import settings as settings_mod
from tailguard.demo.observe import run_story
from tailguard.demo.plan import DEMO_PLAN, ROOT, TEST_PLAN, DemoError, Plan, settings_lines, with_source
from tailguard.demo.plot import plot
from tailguard.demo.render import Screen, render_report
from tailguard.demo.story import load_run, save_run
from tailguard.settings import redact_url


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tailguard.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--plot", default=str(ROOT / "out" / "demo.png"), help="PNG to write (default out/demo.png)")
    p.add_argument("--fast", action="store_true", help="the end-to-end test's plan: 1-s ticks, about a minute")
    p.add_argument("--keep-logs", action="store_true", help="keep the children's logs even when all went well")
    p.add_argument("--data", default=str(ROOT / "out" / "demo.json"),
                   help="where to save the run's observations, JSON (default out/demo.json)")
    p.add_argument("--source", choices=("emitter", "metrics"), default="emitter",
                   help="where latencies come from: the nodes' emitter (default), or their /metrics as vLLM "
                        "serves it, polled by `tailguard scrape` (no code in the servers)")
    p.add_argument("--replot", metavar="JSON", default=None,
                   help="run nothing: print the report and redraw the plot of a saved run")
    return p


async def _main(args: argparse.Namespace, plan: Plan, screen: Screen) -> int:
    cfg = settings_mod.load()
    run_dir = Path(tempfile.mkdtemp(prefix="tailguard-demo-"))
    screen.progress(f"Kafka {cfg.kafka_bootstrap}, Redis {redact_url(cfg.redis_url)}")
    screen.progress("detector settings of this demo (* = differs from the production default):")
    for line in settings_lines(plan):
        print(line, file=screen.out)
    if plan.source == "metrics":
        screen.progress("latencies from the nodes' /metrics (as vLLM serves it), polled by tailguard scrape "
                        "every tick: no emitter in the nodes")
    screen.progress(f"the story: {plan.nodes} healthy nodes; {plan.slow_node} becomes {plan.slowdown:g}x slower at "
                    f"t={plan.onset_s:g}s" + ("" if plan.end_s is None else f" and recovers at t={plan.end_s:g}s")
                    + ("" if plan.graded_node is None else
                       f"; then {plan.graded_node} becomes {plan.graded_slowdown:g}x slower at "
                       f"t={plan.graded_onset_s:g}s for good, below the ejection rules (the graded phase)")
                    + f"; ends by itself (at the latest t={plan.deadline_s:g}s)")
    try:
        story = await run_story(plan, kafka_bootstrap=cfg.kafka_bootstrap, redis_url=cfg.redis_url,
                                run_dir=run_dir, progress=screen.progress, show=screen.show)
    except asyncio.CancelledError:
        if not args.keep_logs:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    except DemoError:
        print(f"logs: {run_dir}", file=screen.out)
        raise
    print(render_report(story), file=screen.out)
    save_run(story, Path(args.data))
    path = Path(args.plot)
    plot(story, path)
    print(f"plot: {path}\ndata: {args.data}", file=screen.out)
    if story.complete and not args.keep_logs:
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        print(f"logs: {run_dir}", file=screen.out)
    return 0 if story.complete else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.replot:
        story = load_run(Path(args.replot))
        print(render_report(story))
        plot(story, Path(args.plot))
        print(f"plot: {args.plot}")
        return 0 if story.complete else 1
    plan = with_source(TEST_PLAN if args.fast else DEMO_PLAN, args.source)
    screen = Screen(plan, sys.stdout)
    loop = asyncio.new_event_loop()
    task = loop.create_task(_main(args, plan, screen))
    stopped_by: list[str] = []

    def stop(name: str) -> None:
        stopped_by.append(name)
        task.cancel()      # the cleanup runs in the task's finally blocks
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop, sig.name)
    try:
        return loop.run_until_complete(task)
    except asyncio.CancelledError:
        print(f"\n{stopped_by[0] if stopped_by else 'cancelled'}: children stopped, run data deleted",
              file=sys.stderr)
        return 130 if stopped_by[:1] == ["SIGINT"] else 143
    except DemoError as e:
        print(f"\ndemo failed: {e}", file=sys.stderr)
        return 1
    finally:
        loop.close()


if __name__ == "__main__":
    raise SystemExit(main())
