"""Open or update the one pull request of a change set, through the GitHub REST API.

The workflow's watch news reaches a person here: the branch (``watch/<hash of the change set>``) carries
the proposed patches and the lock update; the report is the pull request's body. "One pull request per
change set": an open pull request whose head is the same branch is updated (PATCH), never duplicated.

The endpoints used (the subset a test server speaks)::

    GET   {api}/repos/{owner}/{name}                      default branch, when no base is given
    GET   {api}/repos/{owner}/{name}/pulls?head=o:b&state=open
    POST  {api}/repos/{owner}/{name}/pulls                {title, head, base, body}
    PATCH {api}/repos/{owner}/{name}/pulls/{number}       {title, body}

The token (``GITHUB_TOKEN``, the workflow's own) goes only into the Authorization header; no message
names it, and any text that echoes it is redacted before it is printed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import requests

from stackforge.core.errors import SpecError, StackforgeError

#: What Actions sets as ``GITHUB_API_URL`` on github.com.
DEFAULT_API_URL = "https://api.github.com"
#: GitHub refuses a pull-request body longer than this (characters).
MAX_BODY = 65_536
TIMEOUT = (5, 30)

_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}")
# A branch name git and GitHub both take: no spaces, no "..", no leading "-" or "/", no control characters.
_BRANCH = re.compile(r"(?!.*\.\.)(?!.*//)[A-Za-z0-9_][A-Za-z0-9._/-]{0,199}(?<![./])")
_TRUNCATED = "\n\n*(report truncated to fit a pull-request body; the whole report is the run's artifact)*\n"


class GitHubApiError(StackforgeError):
    """The GitHub API did not do what was asked: unreachable, refused (401/403/422) or an unexpected answer."""

    code = "ci.github_api"
    exit_code = 3


@dataclass(frozen=True, slots=True)
class PullRequestSpec:
    """One change set's pull request.

    Attributes:
        repo: ``owner/name``.
        branch: the head branch, already pushed (in the same repository).
        title: one line.
        body: markdown (the watch report); cut to GitHub's limit with a note.
        base: the branch to merge into; ``None`` asks the API for the repository's default branch.
    """

    repo: str
    branch: str
    title: str
    body: str
    base: str | None = None

    def __post_init__(self) -> None:
        if not _REPO.fullmatch(self.repo):
            raise SpecError(f"--repo {self.repo!r} is not OWNER/NAME", remedy="e.g. --repo acme/stackforge")
        for option, branch in (("--branch", self.branch), ("--base", self.base)):
            if branch is not None and (not _BRANCH.fullmatch(branch) or branch.endswith(".lock")):
                raise SpecError(f"{option} {branch!r} is not a branch name",
                                remedy="letters, digits, '.', '_', '-' and '/', e.g. watch/3f2a9c1e")
        if not self.title.strip() or "\n" in self.title or len(self.title) > 256:
            raise SpecError("--title must be one non-empty line of at most 256 characters")

    @property
    def owner(self) -> str:
        return self.repo.partition("/")[0]


@dataclass(frozen=True, slots=True)
class PullRequestOutcome:
    """What :func:`open_or_update` did: ``opened`` or ``updated``, and the pull request's number and page."""

    action: str
    number: int
    url: str

    def one_line(self) -> str:
        return f"{self.action} pull request #{self.number}: {self.url}"


def fit_body(body: str, limit: int = MAX_BODY) -> str:
    """``body`` within GitHub's limit: cut at a line end, with a note saying so."""
    if len(body) <= limit:
        return body
    cut = body[: limit - len(_TRUNCATED) - len("\n```")]   # room for the note and a closing fence
    cut = cut[: cut.rfind("\n")] if "\n" in cut else cut
    # An open code fence would swallow the note: close it.
    if cut.count("```") % 2:
        cut += "\n```"
    return cut + _TRUNCATED


def api_url(value: str | None) -> str:
    """The API base (``GITHUB_API_URL``; GitHub Enterprise has its own), checked: http(s), no credentials."""
    url = (value or DEFAULT_API_URL).rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
        raise SpecError(f"GITHUB_API_URL {parts.scheme}://{parts.hostname or ''}... is not an http(s) URL "
                        "without credentials", remedy="e.g. https://api.github.com (Actions sets it)")
    return url


def open_or_update(spec: PullRequestSpec, *, token: str, api: str = DEFAULT_API_URL,
                   session: requests.Session | None = None) -> PullRequestOutcome:
    """Update the open pull request whose head is ``spec.branch``, or open one.

    Raises:
        SpecError: no token.
        GitHubApiError: the API could not be reached or refused (the status and GitHub's message, redacted).
    """
    if not token:
        raise SpecError("no GitHub token: GITHUB_TOKEN is empty or unset",
                        remedy="in a workflow step: env: GITHUB_TOKEN: ${{ github.token }}")
    client = _Client(session or requests.Session(), api_url(api), token)
    base = f"/repos/{spec.repo}"
    body = fit_body(spec.body)
    found = client.call("GET", f"{base}/pulls", params={"head": f"{spec.owner}:{spec.branch}", "state": "open"})
    if not isinstance(found, list):
        raise GitHubApiError(f"GET {base}/pulls answered {type(found).__name__}, not a list of pull requests")
    if found:
        number = _number(found[0], f"GET {base}/pulls")
        updated = _object(client.call("PATCH", f"{base}/pulls/{number}", json={"title": spec.title, "body": body}),
                          f"PATCH {base}/pulls/{number}")
        return PullRequestOutcome("updated", number, str(updated.get("html_url", "")))
    target = spec.base or str(_object(client.call("GET", base), f"GET {base}").get("default_branch") or "")
    if not target:
        raise GitHubApiError(f"GET {base} named no default branch", remedy="pass --base BRANCH")
    opened = _object(client.call("POST", f"{base}/pulls",
                                 json={"title": spec.title, "head": spec.branch, "base": target, "body": body}),
                     f"POST {base}/pulls")
    return PullRequestOutcome("opened", _number(opened, f"POST {base}/pulls"), str(opened.get("html_url", "")))


def _object(answer: Any, what: str) -> dict[str, Any]:
    """An answer that must be a JSON object (a repository, a pull request); anything else is the API's fault."""
    if not isinstance(answer, dict):
        raise GitHubApiError(f"{what} answered {type(answer).__name__}, not a JSON object")
    return answer


def _number(item: Any, what: str) -> int:
    number = item.get("number") if isinstance(item, dict) else None
    if not isinstance(number, int) or isinstance(number, bool) or number < 1:
        raise GitHubApiError(f"{what} answered a pull request without a number")
    return number


class _Client:
    """The few calls made, each with the token in its header and a one-line error when it fails."""

    def __init__(self, session: requests.Session, api: str, token: str) -> None:
        self._session, self._api, self._token = session, api, token

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/vnd.github+json",
                   "X-GitHub-Api-Version": "2022-11-28", "User-Agent": "stackforge-ci"}
        try:
            response = self._session.request(method, self._api + path, headers=headers, timeout=TIMEOUT, **kwargs)
        except requests.RequestException as exc:
            raise GitHubApiError(f"{method} {self._api}{path} could not be sent: {self._redact(type(exc).__name__)}",
                                 remedy="check GITHUB_API_URL and the network") from None
        if response.status_code >= 400:
            raise GitHubApiError(f"{method} {path} answered HTTP {response.status_code}: "
                                 f"{self._redact(_message(response))}", remedy=_remedy(response.status_code)) from None
        try:
            return response.json()
        except ValueError:
            raise GitHubApiError(f"{method} {path} answered HTTP {response.status_code} without JSON") from None

    def _redact(self, text: str) -> str:
        return text.replace(self._token, "***") if self._token else text


def _message(response: requests.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        data = None
    words = data.get("message") if isinstance(data, dict) else None
    errors = data.get("errors") if isinstance(data, dict) else None
    if isinstance(errors, list) and errors:
        words = f"{words}; {errors[0].get('message', errors[0]) if isinstance(errors[0], dict) else errors[0]}"
    text = " ".join(str(words or response.reason or "").split())
    return text[:200]


def _remedy(status: int) -> str:
    if status in (401, 403):
        return ("the job needs `permissions: contents: write, pull-requests: write`, and the repository's "
                "Actions settings must allow GitHub Actions to create pull requests")
    if status == 404:
        return "check --repo, and that the token can see the repository"
    if status == 422:
        return "check that --branch was pushed and differs from --base"
    return "retry later; see https://www.githubstatus.com"


__all__ = ["DEFAULT_API_URL", "GitHubApiError", "MAX_BODY", "PullRequestOutcome", "PullRequestSpec", "api_url",
           "fit_body", "open_or_update"]
