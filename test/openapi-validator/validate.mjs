// validate.mjs FILE: validates the OpenAPI document FILE with
// @apidevtools/swagger-parser (against the OpenAPI 3.1 JSON Schema, then
// its own checks: $refs resolve, operation ids are unique, path
// parameters are declared), and prints its version and title.
import SwaggerParser from "@apidevtools/swagger-parser";

const file = process.argv[2];
if (!file) {
  console.error("usage: node validate.mjs openapi.json");
  process.exit(2);
}
try {
  const api = await SwaggerParser.validate(file);
  console.log(`valid: OpenAPI ${api.openapi}, ${api.info.title}, ${Object.keys(api.paths).length} paths`);
} catch (err) {
  console.error(`invalid: ${err.message}`);
  process.exit(1);
}
