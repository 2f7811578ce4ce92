"""radixtop's Textual themes: dark, light and high contrast, with severity colours as variables.

Severity must survive NO_COLOR (Textual then turns every colour to grey) and colour-blind eyes, so
colour is never the only signal: each severity also has a marker and a text style (see
SEVERITY_MARKERS and the `logview--*` rules that use these variables).
"""

from __future__ import annotations

from textual.theme import Theme

# Two cells each, so the column lines up; readable with no colour at all.
SEVERITY_MARKERS = {
    "critical": "!!",
    "error": "! ",
    "warning": "~ ",
    "info": "· ",
    "notice": "» ",  # a message from radixtop itself (rotation, truncation, errors)
    None: "  ",
}

# CLI --theme value -> registered theme name.
CLI_THEMES = {
    "dark": "radixtop-dark",
    "light": "radixtop-light",
    "high-contrast": "radixtop-high-contrast",
}

# Variables every theme defines; App.get_theme_variable_defaults returns the dark ones so that a
# built-in Textual theme chosen from the command palette still parses our CSS.
_DARK_VARIABLES = {
    "sev-critical": "#ff5f87",
    "sev-error": "#ff6b5f",
    "sev-warning": "#f5c451",
    "sev-info": "#6cc7f0",
    "sev-notice": "#c3a6ff",
    "search-match": "#f5c451",
    "cursor-line": "#2d3b4f",
    "log-dim": "#7d8796",
    "footer-key-foreground": "#6cc7f0",
}

THEMES: dict[str, Theme] = {
    "radixtop-dark": Theme(
        name="radixtop-dark",
        primary="#4f9fe8",
        secondary="#8fa3bf",
        accent="#f5c451",
        warning="#f5c451",
        error="#ff6b5f",
        success="#6ad19a",
        foreground="#dde3ea",
        background="#0f1419",
        surface="#151b22",
        panel="#1d2630",
        dark=True,
        variables=dict(_DARK_VARIABLES),
    ),
    # Light: every severity colour is dark enough for text on a near-white background
    # (contrast ratio >= 4.5:1, WCAG AA), unlike the usual yellow-for-warnings.
    "radixtop-light": Theme(
        name="radixtop-light",
        primary="#0b5cad",
        secondary="#44546a",
        accent="#8a4b00",
        warning="#8a4b00",
        error="#b3261e",
        success="#1b6e3a",
        foreground="#1c232b",
        background="#fbfbf8",
        surface="#f1f1ec",
        panel="#e4e4dc",
        dark=False,
        variables={
            "sev-critical": "#a0003c",
            "sev-error": "#b3261e",
            "sev-warning": "#8a4b00",
            "sev-info": "#0b5c8a",
            "sev-notice": "#5b3a9e",
            "search-match": "#ffd75f",
            "cursor-line": "#d7e6f7",
            "log-dim": "#5d6672",
            "footer-key-foreground": "#0b5cad",
        },
    ),
    "radixtop-high-contrast": Theme(
        name="radixtop-high-contrast",
        primary="#ffffff",
        secondary="#ffff00",
        accent="#ffff00",
        warning="#ffff00",
        error="#ff4040",
        success="#00ff00",
        foreground="#ffffff",
        background="#000000",
        surface="#000000",
        panel="#1a1a1a",
        dark=True,
        luminosity_spread=0.0,
        text_alpha=1.0,
        variables={
            "sev-critical": "#ff3b3b",
            "sev-error": "#ff7070",
            "sev-warning": "#ffff00",
            "sev-info": "#00ffff",
            "sev-notice": "#ff80ff",
            "search-match": "#ffff00",
            "cursor-line": "#303030",
            "log-dim": "#c0c0c0",
            "footer-key-foreground": "#ffff00",
        },
    ),
}

THEME_CYCLE = tuple(THEMES)  # the order the `t` key walks


def variable_defaults() -> dict[str, str]:
    """Fallbacks for our variables under a theme that does not define them."""
    return dict(_DARK_VARIABLES)


def next_theme(current: str) -> str:
    """The theme after `current` in THEME_CYCLE (the first one for a theme not in it)."""
    try:
        return THEME_CYCLE[(THEME_CYCLE.index(current) + 1) % len(THEME_CYCLE)]
    except ValueError:
        return THEME_CYCLE[0]
