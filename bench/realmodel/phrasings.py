"""The words the facts scenario plants its facts in, and asks for them with.

Each kind of fact has several phrasings, picked by seed (``scenarios.facts``), so that a
run measures the proxy on wordings, not on one sentence per kind that a rule could be
fitted to. The wordings are the kinds people use in chat: a role several words away from
the name, a date given as the day something will happen, an amount with words between
its label and its value and a thousands separator, a setting stated in passing.

``HELD_OUT`` phrasings are drawn like the others but must never appear in ``proxy/``
or ``tests/`` (``tests/test_bench_phrasings.py`` checks it): no value rule or unit test
may be written for them, so their recall says how the rules do on words they were not
written for. Add phrasings to either list freely; never move one from ``HELD_OUT`` to
``PLANTS`` (it has been seen by whoever fitted a rule since).

Fields, filled by ``scenarios.facts``: ``{person}``, ``{date}``, ``{amount}``, ``{path}``,
``{ticket}``, ``{port}``, ``{codename}``; decisions: ``{chosen}``, ``{rejected}``,
``{subject}`` (questions get ``{subject}`` too).
"""

from __future__ import annotations

KINDS = ("person", "date", "amount", "path", "id", "setting", "decision", "codename")

# The phrasings unit tests may quote (and rules may have been written for).
PLANTS: dict[str, tuple[str, ...]] = {
    "person": (
        "Quick heads-up: if the release needs a sign-off, talk to {person}, who took over "
        "that job last week.",
        "{person} has agreed to run the release this time, including the final sign-off.",
        "The release manager role, after a lot of back and forth in the planning meeting, "
        "went to {person}.",
        "We asked around and {person} will coordinate the release, from the code freeze to "
        "the announcement.",
        "For anything to do with the release, the person to ask from now on is {person}.",
    ),
    "date": (
        "We go live with the public launch on {date}, so plan the announcements around that.",
        "Marketing wants everything ready early, because the product launches publicly on {date}.",
        "Mark your calendars: {date} is the day the product opens to the public.",
        "The launch slipped a little; the public will now first see the product on {date}.",
        "The public launch happens on {date} and nothing is allowed to move it.",
    ),
    "amount": (
        "Finance signed off on the load tests yesterday: we get {amount} to spend on them "
        "in total.",
        "For the load tests, the budget that finance finally approved comes to {amount}.",
        "We can spend up to {amount} on the load tests, which is what finance agreed to.",
        "Good news on money: finance set aside {amount} for the load-testing work.",
        "The load tests have a budget now, and after some haggling it is {amount}.",
    ),
    "path": (
        "The service picks up its settings from {path} when it starts, on every host.",
        "If you need to change the service configuration, edit {path}; that is the file it reads.",
        "Heads-up: the service configuration moved, it now lives at {path} on all machines.",
        "Note for later: the service reads its configuration from {path} on every host.",
        "The deploy script writes the service configuration to {path} before each restart.",
    ),
    "id": (
        "I opened {ticket} for the migration, so please log all progress there.",
        "All the migration tasks hang off {ticket} in the tracker.",
        "If anyone asks about the migration, point them to {ticket}, which has the full history.",
        "The migration work is tracked in ticket {ticket}; keep that id in mind.",
        "The migration has its own entry in the tracker now, {ticket}, with the plan attached.",
    ),
    "setting": (
        "In production the admin API is served on {port}, not on the default.",
        "Firewall note: open {port} for the admin API on the production boxes.",
        "The admin API binds to {port} in production; the other environments differ.",
        "Also remember that the admin API listens on port {port} in production.",
        "To reach the admin API in production, connect to {port} on the internal address.",
    ),
    "decision": (
        "After a long debate we went with {chosen} instead of {rejected} for the {subject}.",
        "The {subject} question is settled: {rejected} is out, {chosen} is in.",
        "We ended up picking {chosen} for the {subject}; {rejected} was the runner-up.",
        "Decision from yesterday's meeting: the {subject} will be built on {chosen}, and we "
        "dropped {rejected}.",
        "{rejected} lost the vote, so the team is going ahead with {chosen} for the {subject}.",
    ),
    "codename": (
        "Internally we call the project {codename}, so you will see that name in the docs.",
        "The project got its codename today: {codename}.",
        "{codename} is what everyone calls this project internally; use it in commit messages.",
        "Please remember this for later: the project codename is {codename}.",
        "Leadership picked {codename} as the project's name until the real branding is ready.",
    ),
}

# HELD OUT: never quote these in proxy/ or tests/, nor write a rule for them.
HELD_OUT: dict[str, tuple[str, ...]] = {
    "person": (
        "Whoever wants the release approved has to go through {person} now; nobody else "
        "can give the go-ahead.",
        "Since the reorganisation it is {person} who holds the keys to every release we ship.",
    ),
    "date": (
        "Our first outside users get their hands on it on {date}, the day of the public launch.",
    ),
    "amount": (
        "After two rounds of haggling, the load tests came away from finance with {amount} "
        "of budget.",
    ),
    "path": (
        "Everything the service is configured with comes out of a single file, namely {path}.",
    ),
    "id": ("Progress notes on the migration belong under {ticket} rather than in the chat.",),
    "setting": ("Production keeps its admin API reachable over {port}, once you are on the VPN.",),
    "decision": (
        "Nobody objected in the end, so the {subject} runs on {chosen} and we stop "
        "evaluating {rejected}.",
    ),
    "codename": (
        "Until marketing names it, the project goes by {codename} in every internal channel.",
    ),
}

QUESTIONS: dict[str, tuple[str, ...]] = {
    "person": (
        "Who is in charge of the release? Reply with the full name only.",
        "Which person coordinates the release? Give the full name only.",
        "Whom do I ask to sign off the release? Reply with the person's full name only.",
    ),
    "date": (
        "On what date is the public launch? Reply with the date only.",
        "When does the product launch publicly? Reply with the date only.",
        "What day did we settle on for the public launch? Give the date only.",
    ),
    "amount": (
        "How much money did finance approve for the load tests? Reply with the amount only.",
        "What is the budget for the load tests? Reply with the amount only.",
        "How much can we spend on the load tests? Give the amount only.",
    ),
    "path": (
        "Which file does the service read its configuration from? Reply with the path only.",
        "Where does the service configuration live? Reply with the file path only.",
        "What is the path of the service's configuration file? Give the path only.",
    ),
    "id": (
        "Which ticket tracks the migration work? Reply with the ticket id only.",
        "What is the tracker id for the migration? Reply with the id only.",
        "Where do I log migration progress? Give the ticket id only.",
    ),
    "setting": (
        "Which port does the admin API use in production? Reply with the number only.",
        "On what port is the production admin API? Reply with the port number only.",
        "Which port do I open for the admin API in production? Give the number only.",
    ),
    "decision": (
        "Which technology did the team choose for the {subject}? Reply with its name only.",
        "What did we decide to build the {subject} on? Reply with the name only.",
        "Which option won for the {subject}? Give the name only.",
    ),
    "codename": (
        "What is the project's internal codename? Reply with the codename only.",
        "What do we call the project internally? Reply with the codename only.",
        "Which codename does the project go by? Give the codename only.",
    ),
}

# What a decision is about, and the names it is between (two are drawn per seed).
DECISIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("event bus", ("NATS", "RabbitMQ", "Pulsar", "Redpanda", "ZeroMQ", "ActiveMQ")),
    ("metrics store", ("VictoriaMetrics", "InfluxDB", "TimescaleDB", "ClickHouse", "Graphite")),
    ("job queue", ("Sidekiq", "Temporal", "Faktory", "BullMQ", "Hangfire", "Beanstalkd")),
    ("search backend", ("Meilisearch", "Typesense", "OpenSearch", "Solr", "Vespa", "Tantivy")),
)
