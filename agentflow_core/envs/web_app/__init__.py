"""The storefront as a real web application: an HTTP server on loopback serving HTML forms and a script.

:mod:`.server` holds the sessions (one checkout per browser context, addressed by a cookie) and
answers the browser; :mod:`.html` lays the pages out; ``static/app.js`` is the client script that
turns clicks and form submits into requests and swaps the answered page in.
"""
