"""`workbench plot`: every run of one experiment or several on one chart, written as an
image. The curves are read and drawn by `workbench.curves`; several experiments' runs are
grouped as `workbench compare` groups them (`workbench.sweep.compare`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from workbench import curves
from workbench.commands.common import (
    EXIT_BAD_INPUT,
    ExperimentsArg,
    experiments_or_fail,
    fail,
    say,
)
from workbench.sweep.compare import comparison_figure


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
    experiments: ExperimentsArg = None,
) -> None:
    """Draw every run of one experiment or several side by side: its reward curve, and its
    eval curve where it has eval records, on one chart.

    Read from each run's metrics.jsonl: the reward is the orchestrator's reward_mean of each
    step's batch, the eval curve eval_reward_mean of each policy version scored on held-out
    prompts (a second panel, once any run has one). Each run has one colour in both panels
    and is named in the legend: by its id, or with several experiments as
    EXPERIMENT/RUN. Runs on different base models or environments are not drawn on one
    axis, as `workbench compare` does not rank them together: each (base model,
    environment) gets a row of its own, titled by them, and the command says why. Drawn
    with matplotlib (no display needed); the format follows the file name. Nothing to draw
    yet is an error (exit status 1), and so is a path that is not an experiment directory.
    """
    paths = experiments_or_fail(experiments)
    try:
        curves.image_format(output)
        figure, apart = comparison_figure(paths)
    except ImportError:
        raise fail("matplotlib is not installed: pip install -e '.[plot]'") from None
    except ValueError as err:
        raise fail(str(err), EXIT_BAD_INPUT) from None
    except curves.NothingToPlot as err:
        raise fail(str(err)) from None
    curves.save(figure, output)
    if apart:
        say(apart)
    say(f"written: {output}")
