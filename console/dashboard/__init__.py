"""The browser dashboard: server-rendered pages kept live over a websocket.

Every page is a set of fragments (templates under ``templates/dashboard/fragments/``,
each one element with a fixed id). A GET renders the whole page; the live
consumer (:mod:`console.dashboard.live`) re-renders the same fragments with the
same context when the cluster changes and pushes them to the page, where the htmx
ws extension swaps them in by id. :mod:`console.dashboard.pages` is the one place
that says which fragments a page has and what they show.
"""
