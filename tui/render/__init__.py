"""Rich rendering shared by the headless CLI and the Textual app: tables, reports, formats. No Textual."""
