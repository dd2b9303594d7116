"""Users, projects with member roles, and hashed API tokens."""
