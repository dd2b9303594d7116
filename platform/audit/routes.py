"""Which URL names are audited writes, as what action on which kind of object.

Keys are resolver view names: the API's router names (`run-cancel`) and the web UI's
(`frontend:run-cancel`). A write whose view name is not here is still recorded, generically
(`unmapped.<method>`); views listed in IGNORED are not writes or are recorded elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

UPDATE = {"PUT": "update", "PATCH": "update", "DELETE": "delete"}


@dataclass(frozen=True)
class Route:
    """object_type: the kind of object; verbs: the action's verb, or one per HTTP method;
    key: the URL keyword (or, with `from_body`, the body field) naming the object;
    verb_from: a URL keyword or body field whose value picks the verb from `verbs`;
    create: the object is made by the request (its id comes from the response or the save);
    made: the kinds of row whose creation shows the create happened (default: object_type),
    and the verb that a row of that kind stands for, when it is not the method's;
    by_status: the verb a response status stands for (202: an invitation, not a membership);
    keep: body fields whose values are kept in `details` (never a secret)."""

    object_type: str
    verbs: str | dict[str, str]
    key: str = "pk"
    from_body: bool = False
    verb_from: str = ""
    create: bool = False
    made: dict[str, str] = field(default_factory=dict)
    by_status: dict[int, str] = field(default_factory=dict)
    keep: tuple[str, ...] = field(default=())

    def made_kinds(self) -> dict[str, str]:
        return self.made or {self.object_type: ""}

    def verb(self, method: str, kwargs: dict, body) -> str | None:
        if self.verb_from:
            choice = kwargs.get(self.verb_from) or _get(body, self.verb_from)
            return self.verbs.get(str(choice)) if isinstance(self.verbs, dict) else None
        if isinstance(self.verbs, dict):
            return self.verbs.get(method)
        return self.verbs


def _get(body, name: str):
    try:
        return body.get(name)
    except AttributeError:
        return None


def _crud(object_type: str, basename: str, keep: tuple[str, ...] = ()) -> dict[str, Route]:
    return {
        f"{basename}-list": Route(object_type, {"POST": "create"}, create=True, keep=keep),
        f"{basename}-detail": Route(object_type, UPDATE, keep=keep),
    }


MEMBER_OPS = {"add": "add", "role": "role_change", "remove": "remove"}

ROUTES: dict[str, Route] = {
    # REST API
    "run-list": Route("run", {"POST": "submit"}, create=True),
    "run-detail": Route("run", UPDATE, keep=("tags",)),
    "run-cancel": Route("run", "cancel"),
    "run-clone": Route("run", "clone", create=True),
    "run-restart": Route("run", "restart", create=True),
    **_crud("project", "project"),
    "project-members": Route("member", {"POST": "add"}, key="username", from_body=True,
                             by_status={202: "invite"}, keep=("username", "role")),
    "project-allocation": Route("project", {"PUT": "allocation", "PATCH": "allocation"},
                                keep=("share_weight", "quotas")),
    "project-webhooks": Route("project", {"POST": "webhook_create"},
                              keep=("name", "url", "events", "format", "allow_local")),
    "project-webhook": Route("project", {"PATCH": "webhook_update", "DELETE": "webhook_delete"},
                             keep=("name", "url", "events", "active", "allow_local")),
    "project-webhook-ping": Route("project", "webhook_ping"),
    "me-notifications": Route("notification", {"PUT": "update"}),
    "me": Route("user", {"PATCH": "email_change"}),
    "project-invitation": Route("invitation", {"DELETE": "withdraw"}, key="invitation_id"),
    "invitation-accept": Route("invitation", "accept"),
    "invitation-decline": Route("invitation", "decline"),
    "project-member": Route("member", {"PATCH": "role_change", "PUT": "role_change",
                                       "DELETE": "remove"}, key="username", keep=("role",)),
    **_crud("experiment", "experiment"),
    "token-list": Route("token", {"POST": "create"}, create=True, keep=("name", "expires_in_days")),
    "token-detail": Route("token", {"DELETE": "revoke"}),
    "model-detail": Route("model", UPDATE),
    "model-version-list": Route("model_version", {"POST": "register"}, create=True,
                                keep=("run", "name", "step", "aliases")),
    "model-version-detail": Route("model_version", UPDATE, keep=("aliases", "tags")),
    **_crud("cluster", "cluster"),
    **_crud("node", "node"),
    "node-drain": Route("node", "drain"),
    "node-undrain": Route("node", "undrain"),
    # web UI form actions
    "frontend:submit": Route("run", "submit", create=True),
    "frontend:run-cancel": Route("run", "cancel"),
    "frontend:run-restart": Route("run", "restart", create=True),
    "frontend:run-notes": Route("run", "update", keep=("tags",)),
    "frontend:project-create": Route("project", "create", create=True, keep=("name",)),
    "frontend:project-allocation": Route("project", "allocation",
                                         keep=("share_weight", "quota_npu", "quota_gpu",
                                               "quota_cpu")),
    "frontend:run-register": Route("model_version", "register", create=True,
                                   keep=("name", "step", "aliases")),
    "frontend:model-version": Route("model_version", {"POST": "update"}, key="version_id",
                                    keep=("aliases",)),
    "frontend:email-settings": Route("notification", "update", keep=("events",)),
    "frontend:my-email": Route("user", "email_change"),
    "frontend:webhook-create": Route("project", "webhook_create",
                                     keep=("name", "url", "events", "format", "allow_local")),
    "frontend:webhook-action": Route("project", {"ping": "webhook_ping",
                                                 "delete": "webhook_delete"}, verb_from="action"),
    "frontend:experiment-create": Route("experiment", "create", create=True, keep=("name",)),
    "frontend:node-action": Route("node", {"drain": "drain", "undrain": "undrain"}, verb_from="action"),
    "frontend:member-action": Route("member", MEMBER_OPS, key="username", from_body=True,
                                    verb_from="op", made={"member": "", "invitation": "invite"},
                                    keep=("username", "role")),
    "frontend:invitation-answer": Route("invitation", {"accept": "accept", "decline": "decline"},
                                        verb_from="answer"),
    "frontend:token-create": Route("token", "create", create=True, keep=("name", "expires_in_days")),
    "frontend:token-revoke": Route("token", "revoke"),
}

# Not writes (a dry run, an editor conversion) or recorded by the sign-in signals.
IGNORED = {
    "run-validate", "frontend:submit-convert", "frontend:sign-in", "frontend:sign-out",
    "rest_framework:login", "rest_framework:logout",
}


def route_for(view_name: str) -> Route | None:
    return ROUTES.get(view_name)
