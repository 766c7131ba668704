"""Every key of the browser: the footer, the ``?`` help and the command palette all list these."""

from __future__ import annotations

from schedtrace.tui.widgets.charts import Chart
from schedtrace.tui.widgets.detail import DetailPane
from schedtrace.tui.widgets.help import HelpScreen
from schedtrace.tui.widgets.pass_list import PassList
from schedtrace.tui.widgets.screens import Prompt, RequestScreen, TextScreen

KEYS: list[tuple[str, str, str]] = [  # (key, action, description)
    ("n", "jump('divergence', 1)", "Next divergence"),
    ("N", "jump('divergence', -1)", "Previous divergence"),
    ("s", "jump('stall', 1)", "Next stall"),
    ("S", "jump('stall', -1)", "Previous stall"),
    ("e", "jump('error', 1)", "Next error"),
    ("E", "jump('error', -1)", "Previous error"),
    ("d", "jump('desync', 1)", "Next desync"),
    ("D", "jump('desync', -1)", "Previous desync"),
    ("x", "jump('damage', 1)", "Next gap or loss"),
    ("X", "jump('damage', -1)", "Previous gap or loss"),
    ("right_square_bracket", "rank(1)", "Next rank"),
    ("left_square_bracket", "rank(-1)", "Previous rank"),
    ("i", "integrity", "Gaps and losses"),
    ("g", "goto", "Go to pass"),
    ("slash", "find_rid", "Find request"),
    ("f", "filter", "Filter passes"),
    ("r", "request", "Request view"),
    ("tab", "focus_next", "Next pane"),
    ("question_mark", "help", "Help, legend"),
    ("q", "quit", "Quit"),
]
SHOWN = {"n", "s", "e", "g", "slash", "f", "r", "question_mark", "q"}  # the footer's (? lists them all)
PANES: list[tuple[str, type]] = [  # where else keys work, for the help screen
    ("pass list", PassList), ("detail pane", DetailPane), ("charts", Chart), ("request view", RequestScreen),
    ("a prompt", Prompt), ("gaps and losses", TextScreen), ("this help", HelpScreen)]
