"""Alarms that reach people: rules over the cluster's facts (rules.py, pure), the facts
(facts.py), the alarms, rules and webhooks in ZooKeeper (store.py), the one evaluator among the
managers (evaluator.py) and delivery to webhooks (webhooks.py)."""

from sluice.manager.alarms.evaluator import AlarmEvaluator
from sluice.manager.alarms.rules import AlarmConfigError, Rules, RulesError, parse_rules, rules_to_doc
from sluice.manager.alarms.store import AlarmNotFoundError, AlarmStore
from sluice.manager.alarms.webhooks import WebhookConfigError

__all__ = [
    "AlarmConfigError",
    "AlarmEvaluator",
    "AlarmNotFoundError",
    "AlarmStore",
    "Rules",
    "RulesError",
    "WebhookConfigError",
    "parse_rules",
    "rules_to_doc",
]
