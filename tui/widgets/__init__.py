"""The TUI's panels. Each one holds the last view-model part it was given and renders it;
none does data work. All methods run on the UI thread."""

from tui.widgets.panels import (
    BusyOrGpuPanel,
    LatencyPanel,
    Panel,
    SlowestTable,
    StagePanel,
    StatusBar,
    ThroughputPanel,
    VerdictPanel,
)
from tui.widgets.screens import HelpScreen, WaterfallScreen

__all__ = [
    "BusyOrGpuPanel",
    "HelpScreen",
    "LatencyPanel",
    "Panel",
    "SlowestTable",
    "StagePanel",
    "StatusBar",
    "ThroughputPanel",
    "VerdictPanel",
    "WaterfallScreen",
]
