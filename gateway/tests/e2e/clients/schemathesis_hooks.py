"""Schemathesis hooks for gateway/tests/e2e/fuzz_api.rs (loaded with SCHEMATHESIS_HOOKS).

- A list with `watch` in its query is a watch, which streams until its timeout: every such
  request gets `timeoutSeconds=1`, so it must end (with a response) within the request timeout.
- `error_is_status`: every response with a 4xx or 5xx code carries a `Status` (apiVersion v1,
  kind Status, status Failure) whose `code` is the HTTP code, as Kubernetes answers errors.
"""

import json

import schemathesis


@schemathesis.hook
def before_call(ctx, case, kwargs):
    query = case.query
    if query is not None and "watch" in query:
        query["timeoutSeconds"] = "1"


@schemathesis.check
def error_is_status(ctx, response, case):
    """Every error answer is a Status object naming its own HTTP code."""
    code = response.status_code
    if code < 400:
        return None
    if case.method.upper() == "HEAD":
        return None
    try:
        body = json.loads(response.content)
    except ValueError as e:
        raise AssertionError(
            f"{code} answer is not JSON ({e}): {response.content[:300]!r}"
        ) from None
    if not isinstance(body, dict):
        raise AssertionError(f"{code} answer is not an object: {body!r}"[:400])
    problems = []
    if body.get("kind") != "Status":
        problems.append(f"kind {body.get('kind')!r}")
    if body.get("apiVersion") != "v1":
        problems.append(f"apiVersion {body.get('apiVersion')!r}")
    if body.get("status") != "Failure":
        problems.append(f"status {body.get('status')!r}")
    if body.get("code") != code:
        problems.append(f"code {body.get('code')!r}")
    if not isinstance(body.get("message"), str) or not body.get("message"):
        problems.append("no message")
    if problems:
        raise AssertionError(
            f"{code} answer is not a Status ({', '.join(problems)}): {response.content[:300]!r}"
        )
    return None
