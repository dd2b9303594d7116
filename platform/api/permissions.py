"""Who may do what.

Project-scoped objects (projects, experiments, runs) are visible only to the project's members,
so a stranger gets 404 (the querysets filter them out); a member whose role does not allow a
write gets 403. Clusters and nodes are readable by every signed-in user and written by staff.
"""

from rest_framework import permissions

from accounts.models import Project


def project_of(obj) -> Project:
    if isinstance(obj, Project):
        return obj
    return obj.project if hasattr(obj, "project") else obj.experiment.project


class IsStaffOrReadOnly(permissions.BasePermission):
    message = "Only platform administrators (staff) may change clusters and nodes."

    def has_permission(self, request, view):
        return request.method in permissions.SAFE_METHODS or bool(request.user and request.user.is_staff)


class ProjectRole(permissions.BasePermission):
    """Reads for members; writes for owners and maintainers; project changes for owners."""

    def has_object_permission(self, request, view, obj):
        if request.method in permissions.SAFE_METHODS:
            return True
        project = project_of(obj)
        if isinstance(obj, Project):
            self.message = "Only the project's owners may change the project or its members."
            return project.can_admin(request.user)
        self.message = "Viewers cannot change anything: ask a project owner for the maintainer role."
        return project.can_write(request.user)
