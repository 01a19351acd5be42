"""Secrets used by the test suite; the conftest plugin fails any test that logs one of them.

Every test that configures a credential (a target's bearer token, password or API-key header,
a web-config user's password, the controller's webhook headers and URL token, the
Alertmanager receiver's token) takes it from here, so "no secret in any log line of the whole
suite" is checked on every log record of every test, not on a few chosen ones. The check
covers every printable form of each secret (raw, repr-escaped, URL-encoded:
``specwatch.common.redact.forms``) and, on top of this list, everything specwatch itself
registered for redaction while the suite ran.
"""

TARGET_BEARER_TOKEN = "tok-7d3f1c9e2b8a4f60-bearer"
TARGET_BASIC_PASSWORD = "pw-2a9c4e7f1b3d5061-target"
TARGET_API_KEY = "key-5b8e2d4a9c1f3067-apikey"
WEB_USER = "prometheus"
WEB_PASSWORD = "pw-9e1f3a5c7b2d4068-web"
WEBHOOK_HEADER_SECRET = "hdr-3c7a9e1b5d2f4086-webhook"
WEBHOOK_URL_TOKEN = "qtok-8f2b6d4e1a9c3057-url"
RECEIVER_TOKEN = "rcv-1e5a9c3b7d2f4068-alertmanager"
GENERIC_SECRET = "s3cret-6a2e8c4b1d9f3075"

ALL = (TARGET_BEARER_TOKEN, TARGET_BASIC_PASSWORD, TARGET_API_KEY, WEB_PASSWORD,
       WEBHOOK_HEADER_SECRET, WEBHOOK_URL_TOKEN, RECEIVER_TOKEN, GENERIC_SECRET)
