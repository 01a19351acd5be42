"""Secrets used by the test suite; the conftest plugin fails any test that logs one of them.

Every test that configures a credential (a target's bearer token or password, a web-config
user's password) takes it from here, so "no secret in any log line of the whole suite" is
checked on every log record of every test, not on a few chosen ones.
"""

TARGET_BEARER_TOKEN = "tok-7d3f1c9e2b8a4f60-bearer"
TARGET_BASIC_PASSWORD = "pw-2a9c4e7f1b3d5061-target"
WEB_USER = "prometheus"
WEB_PASSWORD = "pw-9e1f3a5c7b2d4068-web"

ALL = (TARGET_BEARER_TOKEN, TARGET_BASIC_PASSWORD, WEB_PASSWORD)
