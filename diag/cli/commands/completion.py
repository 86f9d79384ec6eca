"""``ttft completion bash|zsh``: a shell completion script for every command and option.

Generated from the parser itself, so it never falls behind a new flag: commands, each
command's options, the choices of options that have them, and file names elsewhere. Install
with ``source <(ttft completion bash)`` (zsh: ``autoload -U bashcompinit && bashcompinit``
first, which ``ttft completion zsh`` prints).
"""

from __future__ import annotations

import argparse
import shlex


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("completion", help="print a shell completion script (bash, zsh)",
                       description="Print a completion script for ttft's commands, options and option choices: "
                       "`source <(ttft completion bash)` in ~/.bashrc, or `source <(ttft completion zsh)` in ~/.zshrc.")
    p.add_argument("shell", choices=("bash", "zsh"), help="the shell to complete in")
    return p


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def bash_script(parser: argparse.ArgumentParser) -> str:
    """The bash completion function for ``parser`` (``ttft``'s) and its registration."""
    commands = _subparsers(parser)
    cases = []
    for name, sub in commands.items():
        opts = sorted(o for a in sub._actions for o in a.option_strings)
        choice_cases = [f"            {'|'.join(a.option_strings)}) COMPREPLY=($(compgen -W {shlex.quote(' '.join(map(str, a.choices)))} -- \"$cur\")); return;;"
                        for a in sub._actions if a.option_strings and a.choices]
        positional_choices = [a for a in sub._actions if not a.option_strings and a.choices
                              and not isinstance(a, argparse._SubParsersAction)]
        fallback = (f"COMPREPLY=($(compgen -W {shlex.quote(' '.join(map(str, positional_choices[0].choices)))} -- \"$cur\"))"
                    if positional_choices else "COMPREPLY=($(compgen -f -- \"$cur\"))")
        cases.append(f"        {name})\n"
                     f"          case \"$prev\" in\n" + "".join(c + "\n" for c in choice_cases) +
                     f"          esac\n"
                     f"          if [[ \"$cur\" == -* ]]; then COMPREPLY=($(compgen -W {shlex.quote(' '.join(opts))} -- \"$cur\"))\n"
                     f"          else {fallback}; fi;;")
    top = " ".join(commands) + " --help --version"
    return "\n".join([
        "# ttft completion (bash): source <(ttft completion bash)",
        "_ttft() {",
        "    local cur=\"${COMP_WORDS[COMP_CWORD]}\" prev=\"${COMP_WORDS[COMP_CWORD-1]}\"",
        "    if [[ $COMP_CWORD -eq 1 ]]; then",
        f"        COMPREPLY=($(compgen -W {shlex.quote(top)} -- \"$cur\")); return",
        "    fi",
        "    case \"${COMP_WORDS[1]}\" in",
        *cases,
        "    esac",
        "}",
        "complete -o filenames -F _ttft ttft",
        "",
    ])


def run(args: argparse.Namespace) -> int:
    from diag.cli import build_parser

    script = bash_script(build_parser())
    if args.shell == "zsh":
        script = "autoload -U +X bashcompinit && bashcompinit\n" + script
    print(script, end="")
    return 0
