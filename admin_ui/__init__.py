"""The admin web page: static HTML/CSS/JS modules served at /admin; they talk only to /admin/v1."""
