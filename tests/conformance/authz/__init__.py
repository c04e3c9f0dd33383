"""The differential authorization suite (issue 33): every API key Sluice serves, sent as many
principals (no ACL, the needed ACLs, neighbouring ones) to Apache Kafka with SASL/SCRAM and its
AclAuthorizer and to a secured Sluice cluster; the error codes compared.

``cases`` is the table (one line a case); ``systems`` sets both clusters up alike and sends each
case; ``answers`` turns a response into the codes compared and renders them;
``documented`` reads the differences docs/COMPATIBILITY.md lists."""
