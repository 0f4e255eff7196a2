"""What the real-model bench says: planted facts, filler, tool results and questions.

Everything here is deterministic for a seed (``random.Random(seed)``), so a replicate with
another seed plants other values in other words, and the same seed replays the same
conversation against every mode (direct, trimming, proxy).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

SYSTEM_PROMPT = (
    "You are a helpful assistant for a software team. Answer briefly. When asked for a "
    "value mentioned earlier in the conversation, reply with that exact value."
)
AGENT_SYSTEM_PROMPT = (
    "You are a coding agent working in a repository. You call tools to inspect the project "
    "and report briefly what you found. When asked for a value a tool returned earlier, "
    "reply with that exact value."
)


@dataclass(frozen=True, slots=True)
class Fact:
    """One value to remember: how it is planted, how it is asked for, what counts as recalled."""

    kind: str
    value: str
    plant: str
    question: str
    accept: tuple[str, ...]  # any of these (case-insensitive) in the answer is a recall

    def recalled(self, answer: str) -> bool:
        text = answer.lower()
        return any(a.lower() in text for a in self.accept)


_ADJ = ["amber", "cobalt", "silent", "northern", "crimson", "velvet", "granite", "lunar"]
_ANIMAL = ["otter", "heron", "falcon", "lynx", "badger", "marlin", "ibex", "condor"]
_FIRST = ["Marisol", "Tobias", "Ingrid", "Kwame", "Priyanka", "Esteban", "Yuki", "Halvard"]
_LAST = ["Okafor", "Lindqvist", "Baptiste", "Moreau", "Castellanos", "Nakashima", "Oyelaran"]
_SERVICE = ["ledger", "gateway", "indexer", "billing", "scheduler", "notifier"]
_MONTHS = ["03", "04", "05", "06", "09", "10", "11"]
_TICKET = ["TCK", "OPS", "INC", "REL"]


def facts(seed: int) -> list[Fact]:
    """The eight planted facts of the facts scenario for one seed."""
    rnd = random.Random(seed)
    codename = f"{rnd.choice(_ADJ)}-{rnd.choice(_ANIMAL)}-{rnd.randint(11, 97)}".upper()
    person = f"{rnd.choice(_FIRST)} {rnd.choice(_LAST)}"
    service = rnd.choice(_SERVICE)
    path = f"/etc/{service}/{rnd.choice(['prod', 'live', 'main'])}-{rnd.randint(2, 9)}.toml"
    port = str(rnd.choice([p for p in range(2100, 9900) if p % 100 not in (0, 80)]))
    ticket = f"{rnd.choice(_TICKET)}-{rnd.randint(10000, 99999)}"
    build = str(rnd.randint(40000, 69999))
    date = f"2027-{rnd.choice(_MONTHS)}-{rnd.randint(10, 28)}"
    budget_n = rnd.randint(21, 89) * 1000 + rnd.choice([250, 500, 750])
    budget = f"{budget_n:,}"
    return [
        Fact(
            "codename",
            codename,
            f"Please remember this for later: the project codename is {codename}.",
            "What is the project codename? Reply with the codename only.",
            (codename,),
        ),
        Fact(
            "person",
            person,
            f"One more thing to remember: the release manager for this project is {person}.",
            "Who is the release manager? Reply with the full name only.",
            (person,),
        ),
        Fact(
            "config path",
            path,
            f"Note for later: the service reads its configuration from {path} on every host.",
            "Which file does the service read its configuration from? Reply with the path only.",
            (path,),
        ),
        Fact(
            "port",
            port,
            f"Also remember that the admin API listens on port {port} in production.",
            "Which port does the admin API listen on in production? Reply with the number only.",
            (port,),
        ),
        Fact(
            "ticket id",
            ticket,
            f"The migration work is tracked in ticket {ticket}; keep that id in mind.",
            "Which ticket tracks the migration work? Reply with the ticket id only.",
            (ticket,),
        ),
        Fact(
            "build number",
            build,
            f"For the record, the last good build was build number {build}.",
            "What was the number of the last good build? Reply with the number only.",
            (build,),
        ),
        Fact(
            "date",
            date,
            f"The public launch date has been fixed: {date}. Please remember it.",
            "What is the public launch date? Reply with the date only.",
            (date,),
        ),
        Fact(
            "budget",
            budget,
            f"Finance approved a budget of {budget} dollars for the load tests; remember it.",
            "What budget did finance approve for the load tests? Reply with the amount only.",
            (budget, str(budget_n)),
        ),
    ]


_TOPICS = [
    "code review etiquette",
    "flaky integration tests",
    "database index tuning",
    "on-call rotations",
    "log retention",
    "dependency upgrades",
    "API versioning",
    "caching strategies",
    "feature flags",
    "incident retrospectives",
    "container image size",
    "documentation habits",
]
_SENTENCES = [
    "Our team has been discussing {t} for a while and opinions differ quite a lot.",
    "Some people think {t} should be decided case by case, others want a written policy.",
    "Last quarter we tried a lighter approach to {t} and it mostly worked out fine.",
    "The main worry with {t} is that nobody owns it once the first push is over.",
    "A colleague suggested we look at how other teams handle {t} before changing anything.",
    "We also noticed that {t} interacts with the release schedule in surprising ways.",
    "There is a long thread in the chat about {t} that never reached a conclusion.",
    "New hires usually ask about {t} in their first week, so it matters for onboarding.",
    "Measuring the effect of {t} is hard because so many other things change at once.",
    "In the end we agreed to revisit {t} after the next planning meeting.",
]


def filler(rnd: random.Random, sentences: int = 9) -> str:
    """A chat turn about a random topic, ending with a request for a short answer."""
    topic = rnd.choice(_TOPICS)
    picked = rnd.sample(_SENTENCES, k=min(sentences, len(_SENTENCES)))
    body = " ".join(s.format(t=topic) for s in picked)
    return f"{body} What is one practical tip about {topic}? Answer in one short sentence."


# -- the agent-with-tools scenario -------------------------------------------------------

TOOLS: list[dict[str, object]] = [
    {
        "type": "function",
        "function": {
            "name": "read_config",
            "description": "Read a configuration file of the project and return its settings.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "file path"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_command",
            "description": "Run a shell command in the repository and return its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    },
]


@dataclass(frozen=True, slots=True)
class ToolValue:
    """A value a tool returns (``KEY = VALUE`` in its output), asked about later."""

    key: str
    value: str
    question: str

    def recalled(self, answer: str) -> bool:
        return self.value.lower() in answer.lower()


@dataclass(frozen=True, slots=True)
class AgentStep:
    """One scripted agent step: the user's ask, the tool calls and what the tools returned."""

    ask: str
    calls: list[dict[str, object]]  # assistant tool_calls, as a client replays them
    results: list[str]  # tool outputs, one per call


def tool_values(seed: int) -> list[ToolValue]:
    rnd = random.Random(seed * 7919 + 1)
    host = f"db-{rnd.choice(_SERVICE)}-{rnd.randint(2, 9)}.internal"
    pairs = [
        ("SERVER_PORT", str(rnd.choice([p for p in range(7000, 7999) if p % 100]))),
        ("DB_HOST", host),
        ("MAX_WORKERS", str(rnd.randint(13, 61))),
        ("CACHE_TTL_SECONDS", str(rnd.choice([450, 720, 1350, 2700, 5400]))),
        ("API_VERSION", f"v{rnd.randint(3, 9)}.{rnd.randint(1, 19)}.{rnd.randint(1, 9)}"),
        ("FEATURE_FLAG", f"ff_{rnd.choice(_ANIMAL)}_{rnd.randint(100, 999)}"),
        ("QUEUE_NAME", f"{rnd.choice(_SERVICE)}-jobs-{rnd.randint(10, 99)}"),
        ("RETRY_LIMIT", str(rnd.randint(4, 17))),
        ("LOG_LEVEL", rnd.choice(["TRACE", "NOTICE", "VERBOSE", "CRITICAL"])),
        ("BUCKET", f"s3://{rnd.choice(_ADJ)}-artifacts-{rnd.randint(100, 999)}"),
    ]
    return [
        ToolValue(k, v, f"What {k} did the tools report earlier? Reply with the value only.")
        for k, v in pairs
    ]


_LOG = [
    "INFO  worker started pid={n}",
    "DEBUG cache miss key=session:{n}",
    "INFO  request handled in {n} ms",
    "WARN  slow query took {n} ms on replica",
    "INFO  health check ok after {n} ms",
    "DEBUG flushed {n} metrics to the collector",
    "INFO  compiled module {n} of 240",
    "INFO  test case {n} passed",
]


def _log_lines(rnd: random.Random, lines: int) -> str:
    return "\n".join(rnd.choice(_LOG).format(n=rnd.randint(10, 9999)) for _ in range(lines))


def agent_steps(seed: int, values: list[ToolValue], filler_steps: int) -> list[AgentStep]:
    """Five steps whose config reads carry two values each, then bulky build/test steps."""
    rnd = random.Random(seed * 104729 + 3)
    steps: list[AgentStep] = []
    for i in range(0, len(values), 2):
        path = f"config/{rnd.choice(_SERVICE)}-{i // 2}.env"
        body = "\n".join(
            [f"# {path}"]
            + [f"{v.key} = {v.value}" for v in values[i : i + 2]]
            + [f"UNUSED_SETTING_{rnd.randint(10, 99)} = {rnd.randint(1, 9)}"]
        )
        steps.append(
            AgentStep(
                f"Read {path} and tell me what it configures.",
                [_call(len(steps), "read_config", {"path": path})],
                [body],
            )
        )
    commands = ["make test", "make lint", "git log --oneline -20", "make build", "pytest -q"]
    for _ in range(filler_steps):
        command = rnd.choice(commands)
        steps.append(
            AgentStep(
                f"Run `{command}` and summarize the result in one sentence.",
                [_call(len(steps), "run_command", {"command": command})],
                [f"$ {command}\n{_log_lines(rnd, 24)}\nexit status 0"],
            )
        )
    return steps


def _call(step: int, name: str, args: dict[str, str]) -> dict[str, object]:
    return {
        "id": f"call_{step:03d}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }
