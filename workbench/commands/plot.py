"""`workbench plot`: every run of an experiment on one chart, written as an image. The
curves are read and drawn by `workbench.curves`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from workbench import curves
from workbench.commands.common import EXIT_BAD_INPUT, ExperimentArg, experiment_or_fail, fail, say


def plot(
    output: Annotated[
        Path,
        typer.Option(
            "--output",
            "-o",
            help="Image to write: FILE.png (or .svg, .pdf, ...).",
            show_default=False,
        ),
    ],
    experiment: ExperimentArg = None,
) -> None:
    """Draw every run of an experiment side by side: its reward curve, and its eval curve
    where it has eval records, on one chart.

    Read from each run's metrics.jsonl: the reward is the orchestrator's reward_mean of each
    step's batch, the eval curve eval_reward_mean of each policy version scored on held-out
    prompts (a second panel, once any run has one). Each run has one colour in both panels
    and is named in the legend. Drawn with matplotlib (no display needed); the format
    follows the file name. Nothing to draw yet is an error (exit status 1).
    """
    path = experiment_or_fail(experiment)
    try:
        curves.image_format(output)
        figure = curves.experiment_figure(path)
    except ImportError:
        raise fail("matplotlib is not installed: pip install -e '.[plot]'") from None
    except ValueError as err:
        raise fail(str(err), EXIT_BAD_INPUT) from None
    except curves.NothingToPlot as err:
        raise fail(str(err)) from None
    curves.save(figure, output)
    say(f"written: {output}")
