"""What every surface shows, computed once: the tables and their words (``display``), one chart
as a widget (``chart``), syntax highlighting (``highlight``). Read by the report, the widget,
``compare`` and the command line."""
