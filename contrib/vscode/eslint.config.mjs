// ESLint beside tsc (`npm run lint`): typescript-eslint's strict rules over the extension and its tests.
import js from "@eslint/js";
import tseslint from "typescript-eslint";

export default tseslint.config(
  { ignores: ["dist/", "build/", "e2e/", "node_modules/", "scripts/", "eslint.config.mjs"] },
  js.configs.recommended,
  ...tseslint.configs.strict,
);
