"""Page views, one module per area; they call the same services as the REST API."""
