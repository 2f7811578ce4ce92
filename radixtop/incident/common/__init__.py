"""What several incident actions share: the server's processes and URLs, redaction, the sighting."""
