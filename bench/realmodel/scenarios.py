"""What the real-model bench says: planted facts, filler, tool results and questions.

Everything here is deterministic for a seed (``random.Random(seed)``), so a replicate with
another seed plants other values in other words (``phrasings.py``: several templates per
kind of fact, some held out of the unit tests), and the same seed replays the same
conversation against every mode (direct, trimming, proxy).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import phrasings  # beside this file: run.py puts bench/realmodel/ on sys.path

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
    # ...unless one of these comes first (a decision's rejected option).
    reject: tuple[str, ...] = ()
    phrasing: str = ""  # "date/3", "date/held-out/0": which template planted it
    held_out: bool = False

    def recalled(self, answer: str) -> bool:
        text = answer.lower()
        found = [i for i in (text.find(a.lower()) for a in self.accept) if i >= 0]
        if not found:
            return False
        wrong = [i for i in (text.find(r.lower()) for r in self.reject) if i >= 0]
        return not wrong or min(found) < min(wrong)


_ADJ = ["amber", "cobalt", "silent", "northern", "crimson", "velvet", "granite", "lunar"]
_ANIMAL = ["otter", "heron", "falcon", "lynx", "badger", "marlin", "ibex", "condor"]
_FIRST = ["Marisol", "Tobias", "Ingrid", "Kwame", "Priyanka", "Esteban", "Yuki", "Halvard"]
_FIRST += ["Aurelie", "Dmitri", "Folasade", "Rasmus"]
_LAST = ["Okafor", "Lindqvist", "Baptiste", "Moreau", "Castellanos", "Nakashima", "Oyelaran"]
_LAST += ["Vasquez-Reed", "Thorsen", "Achterberg"]
_SERVICE = ["ledger", "gateway", "indexer", "billing", "scheduler", "notifier"]
_MONTHS = [3, 4, 5, 6, 9, 10, 11]
_MONTH_NAMES = ["January", "February", "March", "April", "May", "June", "July", "August"]
_MONTH_NAMES += ["September", "October", "November", "December"]
_TICKET = ["TCK", "OPS", "INC", "REL", "MIG"]


def _pick(kind: str, seed: int) -> tuple[str, str, bool]:
    """The kind's template for ``seed``: consecutive seeds draw different ones."""
    pool = [(t, f"{kind}/{i}", False) for i, t in enumerate(phrasings.PLANTS[kind])]
    pool += [(t, f"{kind}/held-out/{i}", True) for i, t in enumerate(phrasings.HELD_OUT[kind])]
    # Each kind starts elsewhere in its pool, so one seed mixes held-out and seen ones.
    return pool[(seed + 2 * phrasings.KINDS.index(kind)) % len(pool)]


def _date(rnd: random.Random) -> tuple[str, tuple[str, ...]]:
    """A 2027 date in one of three renderings, and what an answer may give it as."""
    month, day = rnd.choice(_MONTHS), rnd.randint(10, 28)
    name = _MONTH_NAMES[month - 1]
    shown = rnd.choice([f"2027-{month:02d}-{day:02d}", f"{name} {day}, 2027", f"{day} {name} 2027"])
    return shown, date_renderings(month, day)


def date_renderings(month: int, day: int) -> tuple[str, ...]:
    """A 2027 date as an answer may write it (day 10 or later: "May 1" is no prefix)."""
    name = _MONTH_NAMES[month - 1]
    words: tuple[str, ...] = (f"{name} {day}", f"{day} {name}", f"{name[:3]} {day}")
    words += (f"{day} {name[:3]}",)
    words += (f"{name} {day}th", f"{day}th {name}", f"{name[:3]} {day}th", f"{day}th {name[:3]}")
    numbers: tuple[str, ...] = (f"2027-{month:02d}-{day:02d}", f"{month:02d}/{day:02d}/2027")
    numbers += (f"{day:02d}/{month:02d}/2027", f"2027/{month:02d}/{day:02d}")
    return (*numbers, f"{day:02d}.{month:02d}.2027", *words)


def _amount(rnd: random.Random) -> tuple[str, tuple[str, ...]]:
    """An amount, mostly with a thousands separator, and what an answer may give it as."""
    n = rnd.randint(21, 89) * 1000 + rnd.choice([250, 500, 750])
    sep = f"{n:,}"
    shown = rnd.choice([f"{sep} dollars", f"${sep}", f"USD {sep}", f"{sep} euros", f"${n}"])
    return shown, amount_renderings(n)


def amount_renderings(n: int) -> tuple[str, ...]:
    """37500 as 37,500, 37500, 37 500, 37.500, 37.5k or 37.5 thousand."""
    sep, k = f"{n:,}", f"{n / 1000:g}"
    return (
        sep,
        str(n),
        sep.replace(",", " "),
        sep.replace(",", "."),
        f"{k}k",
        f"{k} k",
        f"{k} thousand",
    )


def _path(rnd: random.Random) -> str:
    service = rnd.choice(_SERVICE)
    return rnd.choice(
        [
            f"/etc/{service}/{rnd.choice(['prod', 'live', 'main'])}-{rnd.randint(2, 9)}.toml",
            f"/srv/{service}/conf/settings-{rnd.randint(2, 9)}.yaml",
            f"/opt/{service}/etc/{service}.{rnd.choice(['ini', 'conf', 'json'])}",
        ]
    )


def facts(seed: int) -> list[Fact]:
    """The eight planted facts of the facts scenario for one seed, one per kind."""
    rnd = random.Random(seed)
    codename = f"{rnd.choice(_ADJ)}-{rnd.choice(_ANIMAL)}-{rnd.randint(11, 97)}".upper()
    person = f"{rnd.choice(_FIRST)} {rnd.choice(_LAST)}"
    path = _path(rnd)
    port = str(rnd.choice([p for p in range(2100, 9900) if p % 100 not in (0, 80)]))
    prefix, number = rnd.choice(_TICKET), rnd.randint(10000, 99999)
    ticket = f"{prefix}-{number}"
    date, date_accept = _date(rnd)
    amount, amount_accept = _amount(rnd)
    subject, options = rnd.choice(phrasings.DECISIONS)
    chosen, rejected = rnd.sample(options, 2)
    fields = {
        "person": person,
        "date": date,
        "amount": amount,
        "path": path,
        "ticket": ticket,
        "port": port,
        "codename": codename,
        "chosen": chosen,
        "rejected": rejected,
        "subject": subject,
    }
    values: dict[str, tuple[str, tuple[str, ...]]] = {
        "person": (person, (person,)),
        "date": (date, date_accept),
        "amount": (amount, amount_accept),
        "path": (path, (path,)),
        "id": (ticket, (ticket, f"{prefix} {number}", f"{prefix}{number}")),
        "setting": (port, (port,)),
        "decision": (chosen, (chosen,)),
        "codename": (codename, (codename, codename.replace("-", " "))),
    }
    out = []
    for kind in phrasings.KINDS:
        template, label, held_out = _pick(kind, seed)
        question = rnd.choice(phrasings.QUESTIONS[kind])
        value, accept = values[kind]
        out.append(
            Fact(
                kind,
                value,
                template.format(**fields),
                question.format(**fields),
                accept,
                (rejected,) if kind == "decision" else (),
                label,
                held_out,
            )
        )
    return out


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
