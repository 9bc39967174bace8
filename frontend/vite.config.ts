/// <reference types="vitest/config" />
import { defineConfig } from "vite";
import react from "@vitejs/plugin-react";

// The build goes into the workflows app's static files, so Django (WhiteNoise, collectstatic) serves it
// and the wheel ships it; assets are addressed under STATIC_URL.
export default defineConfig({
  plugins: [react()],
  base: "/static/workflows/builder/",
  build: {
    outDir: "../workflows/static/workflows/builder",
    emptyOutDir: true,
    chunkSizeWarningLimit: 1500,
  },
  server: {
    // `npm run dev` against a local Django (scripts/serve.sh) on port 8000.
    proxy: { "/api": "http://127.0.0.1:8000", "/memories": "http://127.0.0.1:8000" },
  },
  test: {
    environment: "jsdom",
    include: ["src/**/*.test.ts", "src/**/*.test.tsx"],
  },
});
