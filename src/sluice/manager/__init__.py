"""The manager: REST API, web console, metrics and alarms over a Sluice cluster."""
