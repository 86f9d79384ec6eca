"""The TUI's panels. Each one holds the last view-model part it was given and renders it;
none does data work. All methods run on the UI thread."""

from tui.widgets.metrics import BusyOrGpuPanel, LatencyPanel, StagePanel, ThroughputPanel
from tui.widgets.panels import Panel, StatusBar
from tui.widgets.slowest import SlowestTable
from tui.widgets.screens import FleetScreen, HelpScreen, WaterfallScreen
from tui.widgets.verdict import VerdictPanel

__all__ = [
    "BusyOrGpuPanel",
    "FleetScreen", "HelpScreen",
    "LatencyPanel",
    "Panel",
    "SlowestTable",
    "StagePanel",
    "StatusBar",
    "ThroughputPanel",
    "VerdictPanel",
    "WaterfallScreen",
]
