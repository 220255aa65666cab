// The app's entry, under the name Lemonade's own app gives its entry (clients and bookmarks load
// `/renderer.bundle.js` or `/web-app/renderer.bundle.js`). The app itself is plain ES modules.
import '/static/js/main.js';
