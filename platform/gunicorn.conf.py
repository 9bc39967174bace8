"""gunicorn's settings for this site: scripts/serve.sh serves with them (`--config`), and so do the tests
that serve the site as it does. Command-line options (workers, threads, bind) come on top."""

# Searches and recall queries travel in the URL. gunicorn's default request line (4094 bytes) answered
# a long one, such as a search of 1,000 short words, with its own HTML 414 before the API saw it. At
# gunicorn's maximum, 8190 bytes, such a query reaches the API, which answers one over its limits
# (`q`: 4000 characters; `search`: 64 words, 1000 characters) with a JSON 400 naming the parameter and
# the limit. A request line longer than this is still refused by gunicorn itself (414).
limit_request_line = 8190
